"""The fixed shell templates the SSH driver runs, the allow-lists for what names things on a node,
and ``render``, which ``shlex.quote``s every argument (see ``slices.drivers.ssh``)."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence

from slices.drivers.base import ENV_NAME, DriverError

RUNTIMES = ("docker", "enroot", "process")

# Allow-lists for what names things on a node (everything is quoted as well).
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+@-]{0,1023}$")
SAFE_RELATIVE = re.compile(r"^[A-Za-z0-9._+@-][A-Za-z0-9._/+@-]{0,1023}$")
IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")
# Where the marketplace says assets live (marketplace.mounts.PFS_PUBLIC_ROOT); on the node they
# are found under SLICES_ASSET_ROOT.
ASSET_PREFIX = "/pfs/public/"

TAIL_BYTES = 64 * 1024
NO_GPU_DRIVER = "no NVIDIA driver on this test host: GPU check skipped"


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


# A process is alive unless it is gone or a zombie (an unreaped child of a dead parent).
_ALIVE = 'alive() {{ kill -0 "$1" 2>/dev/null && ! grep -qs "^State:[[:space:]]*Z" "/proc/$1/status"; }}; '
_PID_ALIVE = (
    _ALIVE + 'p=$(cat {pid} 2>/dev/null); case "$p" in ""|*[!0-9]*) false;; *) alive "$p";; esac'
)

CMD_ID = "id -u"
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
CMD_START_PROCESS = (
    _PID_ALIVE + " && {{ echo reused; exit 0; }}; cd {root} || exit 1; "
    "( set -a; . {env}; set +a; exec setsid {argv} ) </dev/null >>{output} 2>&1 & "
    'echo $! > {pid}; echo "started pid $!"'
)
CMD_START_DOCKER = (
    "set -a; . {env}; set +a; "
    "if docker container inspect {name} >/dev/null 2>&1; then "
    "docker start {name} >/dev/null && echo reused; else "
    'ib=""; [ -d /dev/infiniband ] && ib="--device=/dev/infiniband --cap-add=IPC_LOCK"; '
    "docker run -d --name {name} --gpus {gpus} --network host --ipc host "
    "--ulimit memlock=-1:-1 --ulimit stack=67108864 $ib --env-file {env_names} {volumes} "
    "{image} {command}; fi"
)
CMD_START_ENROOT = (
    _PID_ALIVE + " && {{ echo reused; exit 0; }}; cd {root} || exit 1; "
    "set -a; . {env}; set +a; "
    "[ -f {squashfs} ] || enroot import -o {squashfs} {image_uri} || exit 1; "
    "enroot list | grep -qx {name} || enroot create --name {name} {squashfs} || exit 1; "
    "( exec setsid enroot start --rw {mounts} {envs} {name} {command} ) "
    "</dev/null >>{output} 2>&1 & "
    'echo $! > {pid}; echo "started pid $!"'
)
CMD_PROCESS_ALIVE = (
    _PID_ALIVE + ' || {{ echo "not running" >&2; tail -n 20 {output} >&2; exit 5; }}'
)
CMD_GPUS_HOST = "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; else echo {none}; fi"
CMD_PROCESS_HEALTH = CMD_PROCESS_ALIVE + "; " + CMD_GPUS_HOST
CMD_DOCKER_HEALTH = (
    "s=$(docker container inspect --format {fmt} {name} 2>&1); "
    '[ "$s" = true ] || {{ echo "container {name}: $s" >&2; exit 5; }}; '
    "docker exec {name} nvidia-smi -L"
)
CMD_TOOLS = 'for t in {tools}; do command -v "$t" >/dev/null 2>&1 && echo "$t"; done; true'
CMD_ALLREDUCE = (
    "set -a; . {env}; set +a; mpirun --allow-run-as-root --hostfile {hostfile} -np {ranks} "
    "-x MASTER_ADDR -x NCCL_IB_HCA -x NCCL_SOCKET_IFNAME -x NCCL_IB_PKEY "
    "all_reduce_perf -b 8 -e 4G -f 2 -g 1"
)
CMD_STOP_PROCESS = (
    _ALIVE + 'p=$(cat {pid} 2>/dev/null); case "$p" in ""|*[!0-9]*) ;; *) '
    'kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; i=0; '
    'while alive "$p" && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; '
    'kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; echo "stopped pid $p";; esac; '
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
    "docker logs {name} 2>&1 | tail -n +{start} | head -n {lines} | head -c {bytes}; "
    's=$(docker container inspect --format {fmt} {name} 2>&1); [ "$s" = true ] || echo __exited__ >&2'
)
CMD_STOP_DOCKER = "docker rm -f {name} >/dev/null 2>&1; true"
# 关机: the container stops and is kept (its writable layer is the system disk); start reuses it.
CMD_PAUSE_DOCKER = "docker stop {name} >/dev/null 2>&1; true"
# 开机 on another node: the instance's directory streams from one node to the other through the
# console (tar keeps the links to the PFS as links; the old pid file stays behind).
CMD_TAR_OUT = "cd {root} && tar --exclude=./pid -cf - ."
CMD_TAR_IN = "mkdir -p -- {root} && tar -C {root} -xf -"
CMD_STOP_ENROOT = CMD_STOP_PROCESS + "; enroot remove -f {name} >/dev/null 2>&1; true"
# Links first (rm never follows them into the PFS), then the instance's directory.
CMD_REMOVE = 'for l in {links}; do [ -L "$l" ] && rm -f -- "$l"; done; rm -rf -- {root}; true'


def clean_abs(path: str, what: str) -> str:
    norm = posixpath.normpath(path or "")
    if not SAFE_PATH.match(norm) or ".." in norm.split("/") or norm != path.rstrip("/"):
        raise DriverError(
            "bad_identifier", f"{what} {path!r} is not an acceptable path", permanent=True
        )
    return norm


def env_file(env: dict[str, str]) -> str:
    """``export NAME='value'`` lines, each value ``shlex.quote``d: sourcing it sets exactly these
    values (newlines and quotes included) and runs nothing."""
    lines = []
    for name, value in env.items():
        if not ENV_NAME.match(name):
            raise DriverError("bad_identifier", f"environment name {name[:64]!r}", permanent=True)
        if "\x00" in value:
            raise DriverError("bad_identifier", f"the value of {name} contains NUL", permanent=True)
        lines.append(f"export {name}={shlex.quote(value)}\n")
    return "".join(lines)
