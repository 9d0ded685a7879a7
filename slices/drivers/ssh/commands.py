"""The fixed shell templates the SSH driver runs, the allow-lists for what names things on a node,
and ``render``, which ``shlex.quote``s every argument (see ``slices.drivers.ssh``).

No template evaluates the instance's environment: it reaches the runtime as data (``--env-file``,
an argument file read by ``xargs -0``), and every binary that matters is named by its absolute
path, under a fixed ``PATH`` (``host_prefix``).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence

from slices import envpolicy
from slices.drivers.base import DriverError

RUNTIMES = ("docker", "enroot", "process")

# Allow-lists for what names things on a node (everything is quoted as well). Always used with
# ``fullmatch``: ``$`` would let a trailing newline through.
SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
OWNER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
SAFE_PATH = re.compile(r"/[A-Za-z0-9._/+@-]{0,1023}")
SAFE_RELATIVE = re.compile(r"[A-Za-z0-9._+@-][A-Za-z0-9._/+@-]{0,1023}")
IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
SEARCH_PATH = re.compile(r"/[A-Za-z0-9._/+@-]{0,255}(:/[A-Za-z0-9._/+@-]{0,255}){0,31}")
# Where the marketplace says assets live (marketplace.mounts.PFS_PUBLIC_ROOT); on the node they
# are found under SLICES_ASSET_ROOT.
ASSET_PREFIX = "/pfs/public/"
# Where an instance may have something mounted (marketplace.mounts.MOUNT_ROOTS, the cloud disks'
# /data): never over a system path of the image (/etc, /usr/bin, /proc, /root/.ssh...).
MOUNT_ROOTS = ("/models/", "/datasets/", "/data/")

TAIL_BYTES = 64 * 1024
NO_GPU_DRIVER = "no NVIDIA driver on this test host: GPU check skipped"

# Binaries every node has at these paths (Debian: coreutils, util-linux, findutils, dash); the
# container runtimes and mpirun are settings (SLICES_DOCKER_BIN...).
SH = "/bin/sh"
SLEEP = "/bin/sleep"
SETSID = "/usr/bin/setsid"
XARGS = "/usr/bin/xargs"
ENV = "/usr/bin/env"
UNSHARE = "/usr/bin/unshare"
NSENTER = "/usr/bin/nsenter"
# The PATH every command runs under unless SLICES_NODE_PATH says otherwise.
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A stopped docker container whose devices, network or environment must change is committed to
# this image (its writable layer is the instance's system disk) and run again from it.
DISK_IMAGE = "gpc-disk/{slug}"
CONFIG_LABEL = "gpc.config"


Arg = str | int | Sequence[str]


def render(template: str, **args: Arg) -> str:
    """Fill ``template``'s ``{name}`` fields, each argument ``shlex.quote``d (a sequence becomes
    its items, each quoted, separated by spaces). Nothing else is ever interpolated."""
    quoted: dict[str, str] = {}
    for key, value in args.items():
        if isinstance(value, str | int):
            quoted[key] = shlex.quote(str(value))
        else:
            quoted[key] = " ".join(shlex.quote(str(v)) for v in value)
    return template.format(**quoted)


def host_prefix(path: str) -> str:
    """``PATH=<fixed>; export PATH;``: what every remote command starts with, so no command name
    is looked up anywhere an instance can write (``path`` is the operator's SLICES_NODE_PATH)."""
    if not SEARCH_PATH.fullmatch(path) or ".." in path.replace(":", "/").split("/"):
        raise DriverError("bad_identifier", f"SLICES_NODE_PATH {path!r}", permanent=True)
    return render("PATH={path}; export PATH; ", path=path)


# A process is alive unless it is gone or a zombie (an unreaped child of a dead parent).
_ALIVE = 'alive() {{ kill -0 "$1" 2>/dev/null && ! grep -qs "^State:[[:space:]]*Z" "/proc/$1/status"; }}; '
_PID_ALIVE = (
    _ALIVE + 'p=$(cat {pid} 2>/dev/null); case "$p" in ""|*[!0-9]*) false;; *) alive "$p";; esac'
)
# Run an argument file (NUL-separated, written by the driver over SFTP) as one command line:
# ``xargs -0`` reads it as data, ``-n`` with its item count and ``-x`` make it one command or
# none (never split in two), in a new session (``setsid``) and in a PID namespace of its own (the
# process rule, SECURITY.md): ``unshare --pid --fork --kill-child`` makes ``xargs`` the
# namespace's init, and everything the instance ever runs lives in that namespace: what the
# workload forks, daemonises (``nohup``, ``setsid``, a double fork) or leaves behind, and what
# the terminal and the instance's sshd start (``_ENTER``). When its init ends (the workload
# exited, or stop killed it) the kernel kills every process left in it; the launcher's death
# kills the init (``--kill-child``). ``--mount-proc`` gives the namespace its own /proc (its
# processes see only each other); mounts made on the node later still reach it (``slave``).
_LAUNCH = (
    "( exec {setsid} {unshare} --pid --fork --kill-child --mount-proc --propagation slave "
    "{xargs} -0 -x -n {count} -s {size} -a {args} {launcher} ) "
    "</dev/null >>{output} 2>&1 & "
    'echo $! > {pid}; echo "started pid $!"'
)
# ``$p``: the instance's launcher (the pid file's process, alive, its command line naming the
# instance's directory), else empty: a stale file's pid, reused by something else, is never it.
_LAUNCHER = (
    _ALIVE + 'p=$(cat {pid} 2>/dev/null); case "$p" in ""|*[!0-9]*) p="";; esac; '
    'if [ -n "$p" ] && ! {{ alive "$p" && '
    'grep -qsaF -- "$(dirname -- {pid})/" "/proc/$p/cmdline"; }}; then p=""; fi; '
)
# ``ns_init``: ``$c``, the init of the launcher's PID namespace (its child in a namespace other
# than its own), waiting up to 5 s for it after a start; ``$n`` that namespace (its inode), and
# ``$P`` the node's processes as one ``ps`` saw them ("pid ppid pidns" lines).
_NS_INIT = (
    "ns_init() {{ c=''; n=''; e=''; [ -n \"$p\" ] || return 1; while :; do "
    "P=$(ps -eo pid=,ppid=,pidns=); "
    'r=$(printf \'%s\\n\' "$P" | awk -v p="$p" \'$1 == p {{ m = $3 }} $2 == p {{ c = $1; n = $3 }} '
    'END {{ if (c != "" && n != "" && n != m) print c, n }}\'); '
    '[ -n "$r" ] && {{ c=${{r% *}}; n=${{r#* }}; return 0; }}; '
    '[ -n "$e" ] || e=$(($(date +%s) + 5)); '
    '[ "$(date +%s)" -ge "$e" ] && return 1; sleep 0.05; done; }}; '
)
# Run what follows inside the instance's namespaces (PID and mount), in its directory: how the
# terminal and the instance's sshd join the instance (exit 5 when it does not run).
ENTER_FIND = (
    _LAUNCHER + _NS_INIT + 'ns_init || {{ echo "the instance is not running" >&2; exit 5; }}; '
)
ENTER_EXEC = 'exec {nsenter} -t "$c" -p -m --wd={root} -- '
_ENTER = ENTER_FIND + ENTER_EXEC
# Run ``{script}`` (a rendered template) by ``sh`` inside the instance (see ``_ENTER``).
CMD_IN_INSTANCE = _ENTER + "{sh} -c {script}"
# A declared web port reaches the instance's own processes only (SECURITY.md, the process rule):
# every socket listening on the port (any address, IPv4 and IPv6) must be held by a process of
# the instance's PID namespace ``$n`` (its file descriptors name the socket's inode). Exit 3 when
# nothing listens there, 6 when anything else does (another tenant, the node's own services).
_PORT_OWNED = (
    'd=$(printf \'%s\\n\' "$P" | awk -v ns="$n" \'$3 == ns {{ printf "/proc/%s/fd ", $1 }}\'); '
    'lis=$(awk -v hp={hexport} \'$4 == "0A" {{ split($2, a, ":"); if (a[2] == hp) print $10 }}\' '
    "/proc/net/tcp /proc/net/tcp6 2>/dev/null | sort -u); "
    '[ -n "$d" ] || {{ echo "the instance is not running" >&2; exit 5; }}; '
    '[ -n "$lis" ] || {{ echo "nothing listens on port {port}" >&2; exit 3; }}; '
    # A link's whole text against the pattern: a file's path (absolute) never passes for a socket.
    'for i in $lis; do [ -n "$(find $d -maxdepth 1 -lname "socket:\\[$i\\]" 2>/dev/null '
    '| head -n 1)" ] || '
    '{{ echo "port {port} is held by a process that is not the instance\'s" >&2; exit 6; }}; '
    "done; echo owned"
)
# A bare process or an enroot container: its launcher's namespace.
CMD_PORT_OWNER = (
    _LAUNCHER
    + _NS_INIT
    + 'ns_init || {{ echo "the instance is not running" >&2; exit 5; }}; '
    + _PORT_OWNED
)
# A docker container on the host's network (a whole node): the container's PID namespace.
CMD_PORT_OWNER_DOCKER_HOST = (
    "c=$({docker} container inspect --format {fmt} {name} 2>/dev/null); "
    'case "$c" in ""|0|*[!0-9]*) {{ echo "the instance is not running" >&2; exit 5; }};; esac; '
    "P=$(ps -eo pid=,ppid=,pidns=); "
    "n=$(printf '%s\\n' \"$P\" | awk -v c=\"$c\" '$1 == c {{ print $3 }}'); "
    '[ -n "$n" ] || {{ echo "the instance is not running" >&2; exit 5; }}; ' + _PORT_OWNED
)
# A docker container on its own network (a shared node): the host port docker published for it.
CMD_PORT_OWNER_DOCKER_PUBLISHED = (
    "{docker} port {name} 2>/dev/null | awk -v want={address} "
    "'$3 == want {{ f = 1 }} END {{ exit !f }}' || "
    '{{ echo "port {port} is not published for the instance" >&2; exit 6; }}; echo owned'
)
CMD_ID = "id -u"
# The node's heartbeat (migration.probe_nodes): seconds since it booted.
CMD_UPTIME = "cat /proc/uptime"
CMD_MOUNT_CHECK = (
    "mkdir -p -- {pfs} && for p in {sources}; do "
    '[ -e "$p" ] || {{ echo "missing: $p" >&2; exit 3; }}; done'
)
# Pairs of (source, link): refuse to replace anything that is not already a link.
CMD_LINK = (
    "set -- {pairs}; while [ $# -gt 1 ]; do "
    'if [ -e "$2" ] && [ ! -L "$2" ]; then echo "not a link: $2" >&2; exit 4; fi; '
    'mkdir -p -- "$(dirname -- "$2")" && ln -sfn -- "$1" "$2" || exit 1; shift 2; done'
)
# The bare process: ``env -i NAME=value... /bin/sh -c <entrypoint>`` from the argument file.
CMD_START_PROCESS = _PID_ALIVE + " && {{ echo reused; exit 0; }}; cd {root} || exit 1; " + _LAUNCH
# A container is reused (开机 on the same host) only when it was created with the same devices,
# network and environment (its label); otherwise its writable layer is committed and a new
# container runs from it. The environment is docker's --env-file (NAME=value lines, no shell).
CMD_START_DOCKER = (
    "if {docker} container inspect {name} >/dev/null 2>&1; then "
    "c=$({docker} container inspect --format {label_fmt} {name} 2>/dev/null); "
    'if [ "$c" = {config} ]; then {docker} start {name} >/dev/null || exit 1; echo reused; '
    "{docker} port {name} 2>/dev/null; exit 0; fi; "
    "{docker} commit {name} {disk} >/dev/null && {docker} rm -f {name} >/dev/null || exit 1; "
    'img={disk}; echo "recreated: its devices, network or environment changed"; '
    "elif {docker} image inspect {disk} >/dev/null 2>&1; then img={disk}; else img={image}; fi; "
    'ib=""; [ {ib} = 1 ] && [ -d /dev/infiniband ] && '
    'ib="--device=/dev/infiniband --cap-add=IPC_LOCK"; '
    "{docker} run -d --name {name} --label {label} {devices} {network} "
    "--ulimit memlock=-1:-1 --ulimit stack=67108864 $ib --env-file {env_file} {publish} "
    '{volumes} "$img" {command} || exit 1; {docker} port {name} 2>/dev/null; true'
)
CMD_START_ENROOT = (
    _PID_ALIVE + " && {{ echo reused; exit 0; }}; cd {root} || exit 1; "
    "[ -f {squashfs} ] || {enroot} import -o {squashfs} {image_uri} || exit 1; "
    "{enroot} list | grep -qx {name} || {enroot} create --name {name} {squashfs} || exit 1; "
    + _LAUNCH
)
CMD_PROCESS_ALIVE = (
    _PID_ALIVE + ' || {{ echo "not running" >&2; tail -n 20 {output} >&2; exit 5; }}'
)
CMD_GPUS_HOST = "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; else echo {none}; fi"
CMD_PROCESS_HEALTH = CMD_PROCESS_ALIVE + "; " + CMD_GPUS_HOST
_DOCKER_RUNNING = (
    "s=$({docker} container inspect --format {fmt} {name} 2>&1); "
    '[ "$s" = true ] || {{ echo "container {name}: $s" >&2; exit 5; }}; '
)
CMD_DOCKER_HEALTH = _DOCKER_RUNNING + "{docker} exec {name} nvidia-smi -L"
# 无卡模式: the container must see no GPU at all (nvidia-smi there fails or lists none).
CMD_DOCKER_HEALTH_NO_GPU = _DOCKER_RUNNING + "{docker} exec {name} nvidia-smi -L 2>/dev/null; true"
# Each tool found on the node, with its path: "<name> <path>" lines.
CMD_TOOLS = (
    'for t in {tools}; do p=$(command -v "$t") && echo "$t $p"; done; '
    "[ -x {mpirun} ] && echo mpirun {mpirun}; true"
)
# The console's values only (``-x NAME=value``): nothing of the instance's environment.
CMD_ALLREDUCE = (
    "{mpirun} --allow-run-as-root --hostfile {hostfile} -np {ranks} {exports} "
    "{allreduce} -b 8 -e 4G -f 2 -g 1"
)
# Everything the instance runs: every process of its PID namespace (``$n``; see ``_LAUNCH``),
# its launcher's session and every descendant, also those that made sessions of their own,
# whose sessions are then followed too (an instance started before the namespace was its rule).
# ``$s`` holds the sessions (" 1 2 "), ``$l`` gets the live pids. A session id is never a pid of
# anything else while a member lives, so nothing outside the instance is ever signalled. dash's
# ``kill`` takes no ``--``: a pid list only. Procps ``ps``; no pattern is matched on names.
_INSTANCE_TREE = (
    'tree() {{ l=$(ps -eo pid=,ppid=,sid=,pidns=,stat= | awk -v s="$s" -v ns="$n" \''
    "{{ p[NR] = $1; pp[NR] = $2; sd[NR] = $3; z[NR] = ($5 ~ /^Z/); "
    'if (index(s, " " $3 " ") || (ns != "" && $4 == ns)) k[$1] = 1 }} '
    "END {{ do {{ n = 0; for (i = 1; i <= NR; i++) if (!(p[i] in k) && (pp[i] in k)) "
    "{{ k[p[i]] = 1; n++ }} }} while (n); "
    "for (i = 1; i <= NR; i++) if ((p[i] in k) && !z[i]) print p[i], sd[i] }}'); "
    "for x in $(printf '%s\\n' \"$l\" | awk '{{ print $2 }}'); do "
    'case "$s" in *" $x "*) ;; *) s="$s$x ";; esac; done; '
    "l=$(printf '%s\\n' \"$l\" | awk '{{ print $1 }}'); }}; "
)
# 关机 and release of a bare process or an enroot container: TERM to all of it but the launcher
# and the namespace's init (which would end the rest at once), up to ten seconds to end (Jupyter
# stops its kernels), then KILL to what is left: the init's death kills whatever the namespace
# still holds, whatever it daemonised. A live pid that is not the instance's launcher is a stale
# file's, reused: left alone. Idempotent.
CMD_STOP_PROCESS = (
    _LAUNCHER + _NS_INIT + _INSTANCE_TREE + 'if [ -n "$(cat {pid} 2>/dev/null)" ] && [ -z "$p" ]; '
    'then echo "the pid file does not name the instance launcher: left alone"; fi; '
    'if [ -n "$p" ]; then ns_init; s=" $p "; tree; '
    'r=$(printf \'%s\\n\' $l | grep -vx -e "$p" -e "${{c:-0}}"); '
    '[ -n "$r" ] && kill -TERM $r 2>/dev/null; e=$(($(date +%s) + 10)); '
    'while [ -n "$r" ] && [ "$(date +%s)" -lt $e ]; do sleep 0.1; tree; '
    'r=$(printf \'%s\\n\' $l | grep -vx -e "$p" -e "${{c:-0}}"); done; '
    '[ -n "$l" ] && kill -KILL $l 2>/dev/null; e=$(($(date +%s) + 5)); '
    'while [ -n "$l" ] && [ "$(date +%s)" -lt $e ]; do sleep 0.1; tree; done; '
    'echo "stopped pid $p"; fi; '
    "rm -f -- {pid}"
)
# The workload's output from line {start} on, at most {lines} lines / {bytes} bytes; then whether
# it still runs (a process's pid, a container's state).
CMD_READ_OUTPUT = (
    "tail -n +{start} {output} 2>/dev/null | head -n {lines} | head -c {bytes}; "
    + _PID_ALIVE
    + " || echo __exited__ >&2"
)
CMD_READ_DOCKER_OUTPUT = (
    "{docker} logs {name} 2>&1 | tail -n +{start} | head -n {lines} | head -c {bytes}; "
    "s=$({docker} container inspect --format {fmt} {name} 2>&1); "
    '[ "$s" = true ] || echo __exited__ >&2'
)
CMD_STOP_DOCKER = (
    "{docker} rm -f {name} >/dev/null 2>&1; {docker} image rm -f {disk} >/dev/null 2>&1; true"
)
# 关机: the container stops and is kept (its writable layer is the system disk); start reuses it.
CMD_PAUSE_DOCKER = "{docker} stop {name} >/dev/null 2>&1; true"
# 开机 on another node: the instance's directory streams from one node to the other through the
# console (tar keeps the links to the PFS as links; the old pid file stays behind).
CMD_TAR_OUT = "cd {root} && tar --exclude=./pid -cf - ."
CMD_TAR_IN = "mkdir -p -- {root} && tar -C {root} -xf -"
CMD_STOP_ENROOT = CMD_STOP_PROCESS + "; {enroot} remove -f {name} >/dev/null 2>&1; true"
# Links first (rm never follows them into the PFS), then the instance's directory.
CMD_REMOVE = 'for l in {links}; do [ -L "$l" ] && rm -f -- "$l"; done; rm -rf -- {root}; true'


def clean_abs(path: str, what: str) -> str:
    norm = posixpath.normpath(path or "")
    if (
        not SAFE_PATH.fullmatch(norm)
        or ".." in (path or "").split("/")
        or norm != (path or "").rstrip("/")
    ):
        raise DriverError(
            "bad_identifier", f"{what} {path!r} is not an acceptable path", permanent=True
        )
    return norm


def _check_format(env: Mapping[str, str]) -> None:
    """Whole names (``fullmatch``), and values docker's env-file and an argument file carry as
    they are (no NUL, no line break; ``envpolicy.value_problem``)."""
    for name, value in env.items():
        if not envpolicy.is_name(name):
            raise DriverError("bad_environment", f"environment name {name[:64]!r}", permanent=True)
        problem = envpolicy.value_problem(value)
        if problem:
            raise DriverError(
                "bad_environment",
                f"the value of {name} is {problem.replace('_', ' ')}",
                permanent=True,
            )


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """An instance's environment as the console gave it, checked: the format every runtime
    needs, and none of the names that steer a shell or the loader (``envpolicy.HOST_CONTROL``),
    whoever set them (the driver sets PATH for a bare process itself)."""
    _check_format(env)
    refused = envpolicy.refused_platform_names(env)
    if refused:
        raise DriverError(
            "bad_environment",
            f"{', '.join(refused)} may not be set in an instance's environment",
            permanent=True,
        )
    return dict(env)


def env_file(env: Mapping[str, str]) -> str:
    """docker's ``--env-file``: ``NAME=value`` lines, each value as it is (docker reads the
    line after the first ``=`` literally: quotes, ``$()`` and backticks included)."""
    _check_format(env)
    return "".join(f"{name}={value}\n" for name, value in env.items())


def argument_file(argv: Sequence[str]) -> tuple[bytes, int, int]:
    """An argument file for ``_LAUNCH``: the items NUL-terminated, their count, and an ``xargs
    -s`` that holds them all (one command line, or xargs refuses to run any)."""
    if not argv:
        raise DriverError("bad_identifier", "an empty command line", permanent=True)
    for item in argv:
        if "\x00" in item:
            raise DriverError("bad_identifier", "a NUL in a command line", permanent=True)
    body = b"".join(item.encode() + b"\x00" for item in argv)
    return body, len(argv), len(body) + 4096


# -- the instance's own sshd (issue 19) ---------------------------------------------------------
SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
# Its pid file names a live process that is this instance's sshd (its config on the command
# line), so a pid reused by anything else is never taken for it, nor killed.
_SSHD_PID = (
    'p=$(cat {pidfile} 2>/dev/null); case "$p" in ""|*[!0-9]*) p="";; *) '
    'grep -qsaF -- {config} "/proc/$p/cmdline" || p="";; esac; '
)
# A bare process (the test hosts): a daemonised sshd of its own, its config, host key and
# authorized_keys in the instance's directory. sshd binds its port before it detaches, so a port
# that is taken fails here; a live one is reused (a re-driven start).
CMD_START_INSTANCE_SSHD = (
    _ALIVE + _SSHD_PID + '[ -n "$p" ] && alive "$p" && {{ echo "sshd reused (pid $p)"; exit 0; }}; '
    "[ -f {hostkey} ] || {keygen} -q -t ed25519 -N '' -C {slug} -f {hostkey} || exit 1; "
    "{sshd} -f {config} -E {sshd_log} || exit 1; echo sshd started"
)
# Stop it and the connections it accepted (its children); idempotent.
CMD_STOP_INSTANCE_SSHD = (
    _SSHD_PID + '[ -n "$p" ] && {{ pkill -TERM -P "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; '
    'echo "stopped sshd $p"; }}; rm -f -- {pidfile}; true'
)
# In a docker container: the image's sshd (a script run by the container's own sh, with its
# arguments as data), host keys made once, reused while it runs; exit 7 when the image has none.
DOCKER_SSHD_SCRIPT = (
    '[ -x /usr/sbin/sshd ] || { echo "the image has no /usr/sbin/sshd" >&2; exit 7; }; '
    "mkdir -p /run/sshd /root/.ssh; ssh-keygen -A >/dev/null 2>&1; "
    "p=$(cat /run/gpc-sshd.pid 2>/dev/null); "
    '[ -n "$p" ] && kill -0 "$p" 2>/dev/null && { echo "sshd reused (pid $p)"; exit 0; }; '
    '/usr/sbin/sshd -o PidFile=/run/gpc-sshd.pid "$@" && echo sshd started'
)
CMD_START_DOCKER_SSHD = "{docker} exec {name} /bin/sh -c {script} sh {sshd_args}"
INSTANCE_SSHD_CONFIG = """\
# The instance's own sshd (written by the GPU console; customers reach it through the region's
# SSH gateway).
Port {port}
ListenAddress {address}
HostKey {root}/ssh_host_ed25519_key
AuthorizedKeysFile {root}/authorized_keys
PidFile {root}/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowUsers root
UseDNS no
AllowTcpForwarding yes
X11Forwarding no
Subsystem sftp internal-sftp
"""
