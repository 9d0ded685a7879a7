"""A slice's Slurm on real nodes (issue 31): Debian's slurmctld, slurmd, slurmrestd and munge,
run inside the tenant's instance (its PID and mount namespaces: they end with it, the process
rule), configured by the console.

- The keys (munge's, the JWT key) and the config files are written as data over SFTP with tight
  modes (``write_files``): keys 0400, root's; the configs 0644 (slurmrestd, not root, reads
  ``slurm.conf``). No shell ever sees a key or a customer's text; the start scripts are fixed
  templates whose every argument is quoted (``render``) and checked (``SlurmLayout``).
- munged runs on the slice's own socket; slurmctld on rank 0; one ``slurmd -N <node>`` per node,
  started by the names ``slurmctld``/``slurmd`` (Debian's ``*-wlm`` file names drop every node's
  GRES); slurmrestd on rank 0's loopback, as ``nobody`` (it refuses root) with
  ``SLURM_JWT=daemon`` and ``openapi/v0.0.38`` only (``dbv0.0.38`` needs slurmdbd).
- The console reaches slurmrestd over its pinned SSH connection (a ``direct-tcpip`` channel,
  kept only when the port is the instance's own: ``SshDriver.open_tunnel``), never a node port.
- On a host without GPUs (the test hosts) the GPUs of ``gres.conf`` are stand-ins: links to
  /dev/null named ``nvidiaN`` (Slurm wants character devices); jobs still get their
  ``CUDA_VISIBLE_DEVICES``.

Only the bare-process runtime runs it yet (README "Slurm and jobs"): in a container the image
must bring the same Slurm; ``slurm_unsupported`` says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import paramiko

from slices.drivers.base import DriverError, InstanceSpec, LogFn, NodeTarget, StepResult
from slices.drivers.slurm import (
    MAX_ANSWER_BYTES,
    OutputChunk,
    RestAnswer,
    SlurmSetup,
    answer_complete,
    http_request,
    parse_http_answer,
)
from slices.drivers.ssh.commands import CMD_IN_INSTANCE, NSENTER, SH, render
from slices.slurmconf import (
    SlurmLayout,
    SlurmPaths,
    detect_api,
    gres_conf,
    slurm_conf,
    topology_conf,
)

if TYPE_CHECKING:
    from slices.drivers.ssh.driver import SshDriver

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
SLURMRESTD = "/usr/sbin/slurmrestd"
MUNGED = "/usr/sbin/munged"
MUNGE = "/usr/bin/munge"
SINFO = "/usr/bin/sinfo"
SETPRIV = "/usr/bin/setpriv"
REST_USER = "nobody"
REST_GROUP = "nogroup"
READY_TIMEOUT = 90.0  # slurmd registers in seconds; a loaded host may take a minute

# The slice's directories (as root, on the host: the console's own files), and the stand-ins
# for /dev/nvidiaN where the node has none.
CMD_SLURM_DIRS = (
    "mkdir -p -m 755 -- {run_root} {run} && mkdir -p -- {run}/spool {run}/log {state} {jobs} "
    "&& chmod 755 {run_root} {run} && chmod 700 {state} && "
    'set -- {devices}; for d in "$@"; do mkdir -p -- "$(dirname -- "$d")" && '
    'ln -sfn /dev/null "$d" || exit 1; done; true'
)
CMD_HAS_GPUS = "[ -e /dev/nvidia0 ] && echo gpus || echo none"
# munged on the slice's socket, unless one already answers there (a test host runs several of
# the slice's nodes: they share it, with the same key).
_MUNGE_UP = (
    "{munge} -n -S {socket} >/dev/null 2>&1 || "
    "{munged} --socket={socket} --key-file={key} --pid-file={run}/munged.pid "
    "--log-file={run}/log/munged.log --seed-file={run}/munge.seed || exit 1; "
)
_ALIVE_PID = (
    'up() {{ p=$(cat "$1" 2>/dev/null); case "$p" in ""|*[!0-9]*) return 1;; esac; '
    'kill -0 "$p" 2>/dev/null && ! grep -qs "^State:[[:space:]]*Z" "/proc/$p/status"; }}; '
)
# A daemon still running with the config it was started with is kept; one whose config changed
# (a node replaced, the slice started again on other nodes) is restarted: slurmctld recovers
# its queue from StateSaveLocation (on /pfs), running job steps outlive a slurmd restart.
# ``$1``: its pid file, ``$2``: the file of the config's hash it started with.
_CURRENT = (
    'h=$(sha256sum {conf} | cut -d" " -f1); '
    'current() {{ up "$1" && [ "$(cat "$2" 2>/dev/null)" = "$h" ]; }}; '
    'halt() {{ up "$1" || return 0; kill "$p"; i=0; while up "$1" && [ $i -lt 100 ]; do '
    "sleep 0.1; i=$((i + 1)); done; }}; "
)
# Run inside the instance (CMD_IN_INSTANCE): what every node starts.
SCRIPT_NODE = (
    _ALIVE_PID
    + _MUNGE_UP
    + _CURRENT
    + "if current {run}/slurmd-{node}.pid {run}/slurmd-{node}.sha; "
    "then echo slurmd {node} reused; exit 0; fi; halt {run}/slurmd-{node}.pid; "
    "SLURM_CONF={conf} {slurmd} -N {node} -f {conf} || exit 1; "
    'echo "$h" > {run}/slurmd-{node}.sha; echo slurmd {node} up'
)
SCRIPT_CONTROLLER = (
    _ALIVE_PID + _MUNGE_UP + _CURRENT + "if current {run}/slurmctld.pid {run}/slurmctld.sha; "
    "then echo slurmctld reused; exit 0; fi; halt {run}/slurmctld.pid; "
    "SLURM_CONF={conf} {slurmctld} -f {conf} || exit 1; "
    'echo "$h" > {run}/slurmctld.sha; echo slurmctld up'
)
# slurmrestd is no daemon: started in its own session in the background, its pid in a file.
SCRIPT_RESTD = (
    _ALIVE_PID + "up {run}/slurmrestd.pid && {{ echo slurmrestd reused; exit 0; }}; "
    "cd / && ( exec /usr/bin/setsid {setpriv} --reuid={user} --regid={group} --clear-groups "
    "/usr/bin/env -i SLURM_JWT=daemon SLURM_CONF={conf} PATH=/usr/sbin:/usr/bin:/sbin:/bin "
    "{restd} -a rest_auth/jwt -s openapi/v0.0.38 {listen} ) </dev/null >>{run}/log/slurmrestd.log "
    '2>&1 & echo $! > {run}/slurmrestd.pid; echo "slurmrestd started"'
)
# Until every node of the slice is idle (or the deadline): "<node> <state>" lines.
CMD_WAIT_IDLE = (
    "e=$(($(date +%s) + {secs})); while :; do "
    "s=$(SLURM_CONF={conf} {sinfo} -h -N -o '%N %t' 2>&1); "
    'n=$(printf \'%s\\n\' "$s" | awk \'$2 == "idle" || $2 == "mix" || $2 == "alloc"\' '
    '| wc -l); [ "$n" -ge {count} ] && {{ printf \'%s\\n\' "$s"; exit 0; }}; '
    '[ "$(date +%s)" -ge "$e" ] && {{ printf \'%s\\n\' "$s" >&2; '
    "tail -n 5 {run}/log/slurmctld.log >&2; exit 7; }}; sleep 0.2; done"
)
CMD_READ_JOB_OUTPUT = "tail -c +{start} {path} 2>/dev/null | head -c {limit}; true"
CMD_REMOVE_SLURM = "rm -rf -- {run}; true"


def _stand_ins(driver: SshDriver, node: NodeTarget, client: paramiko.SSHClient) -> bool:
    """Stand-in devices where the node has no /dev/nvidia0 (a test host)."""
    found = driver.run(client, node, CMD_HAS_GPUS, timeout=10, log=None)
    return "none" in found.stdout


def paths(driver: SshDriver, spec: InstanceSpec, setup: SlurmSetup) -> SlurmPaths:
    return setup.layout(spec, driver._pfs_source(spec), stand_in_devices=False).paths


def _check_runtime(driver: SshDriver, node: NodeTarget) -> None:
    if driver._runtime(node) != "process":
        raise DriverError(
            "slurm_unsupported",
            f"{node.hostname} runs {node.runtime}: Slurm runs in bare-process instances only yet",
            permanent=True,
        )


def start_slurm(driver: SshDriver, spec: InstanceSpec, setup: SlurmSetup, log: LogFn) -> StepResult:
    """See ``slices.drivers.slurm.SlurmDriver.start_slurm``."""
    if not spec.nodes:
        raise DriverError("slurm_failed", "no nodes", permanent=True)
    for node in spec.nodes:
        _check_runtime(driver, node)
    pfs = driver._pfs_source(spec)
    first = spec.nodes[0]
    with driver.session(first) as client:
        stand_in = _stand_ins(driver, first, client)
    layout = setup.layout(spec, pfs, stand_in_devices=stand_in)
    files = _files(layout, setup)

    # Files on every node first (the same text everywhere; one node after another: several nodes
    # of a test host share one directory), then the controller, then the nodes' slurmd in
    # parallel (one connection each).
    for node in spec.nodes:
        with driver.session(node) as client:
            _write(driver, client, node, layout, files)

    def slurmd(node: NodeTarget) -> None:
        with driver.session(node) as client:
            _in_instance(driver, client, spec, node, SCRIPT_NODE, _args(layout, node=node.hostname))

    with driver.session(first) as client:
        _in_instance(driver, client, spec, first, SCRIPT_CONTROLLER, _args(layout, node=""))
    log(f"slurmctld listens on {first.address}:{setup.ctld_port} (cluster {layout.cluster})")
    _each(spec, slurmd)
    log(
        f"slurmd runs on {len(spec.nodes)} node(s), each with "
        f"gpu:{layout.gres_type}:{len(first.gpus)}"
        + (" (stand-in devices: this host has no GPUs)" if stand_in else "")
    )
    with driver.session(first) as client:
        script = render(
            SCRIPT_RESTD,
            run=layout.paths.run,
            setpriv=SETPRIV,
            user=REST_USER,
            group=REST_GROUP,
            conf=layout.paths.conf,
            restd=SLURMRESTD,
            listen=f"127.0.0.1:{setup.restd_port}",
        )
        _in_instance_script(driver, client, spec, first, script)
        waited = driver.run(
            client,
            first,
            CMD_WAIT_IDLE,
            timeout=READY_TIMEOUT + 10,
            check=False,
            log=None,
            secs=int(READY_TIMEOUT),
            conf=layout.paths.conf,
            sinfo=SINFO,
            count=len(spec.nodes),
            run=layout.paths.run,
        )
    if waited.exit_status != 0:
        raise DriverError(
            "slurm_failed",
            f"the slice's nodes did not come up in Slurm: {waited.stderr.strip()[-400:]}",
        )
    version = _detect_version(driver, spec, setup)
    log(f"every node is idle in Slurm; slurmrestd speaks {version} on rank 0's loopback")
    return StepResult({"api_version": version, "nodes": len(spec.nodes), "stand_in": stand_in})


def _each(spec: InstanceSpec, work: Callable[[NodeTarget], None]) -> None:
    """``work`` on every node of the slice in parallel; the first error goes up."""
    with ThreadPoolExecutor(
        max_workers=min(32, len(spec.nodes)), thread_name_prefix="slurm"
    ) as pool:
        for future in [pool.submit(work, node) for node in spec.nodes]:
            future.result()


def _files(layout: SlurmLayout, setup: SlurmSetup) -> list[tuple[str, str | bytes, int]]:
    p = layout.paths
    return [
        (p.conf, slurm_conf(layout), 0o644),
        (f"{p.run}/gres.conf", gres_conf(layout), 0o644),
        (f"{p.run}/topology.conf", topology_conf(layout), 0o644),
        (p.munge_key, setup.munge_key, 0o400),
        (p.jwt_key, setup.jwt_key, 0o400),
    ]


def _write(
    driver: SshDriver,
    client: paramiko.SSHClient,
    node: NodeTarget,
    layout: SlurmLayout,
    files: list[tuple[str, str | bytes, int]],
) -> None:
    p = layout.paths
    devices = (
        [d for n in layout.nodes for d in layout.device_files(n)] if layout.stand_in_devices else []
    )
    run_root = p.run.rsplit("/", 1)[0]
    driver.run(
        client, node, CMD_SLURM_DIRS, run_root=run_root, run=p.run, state=p.state, jobs=p.jobs,
        devices=devices, log=None,
    )  # fmt: skip
    driver.write_files(client, p.run, files)


def _args(layout: SlurmLayout, *, node: str) -> dict[str, Any]:
    p = layout.paths
    args: dict[str, Any] = {
        "munge": MUNGE,
        "munged": MUNGED,
        "socket": p.munge_socket,
        "key": p.munge_key,
        "run": p.run,
        "conf": p.conf,
    }
    if node:
        args.update(node=node, slurmd=SLURMD)
    else:
        args.update(slurmctld=SLURMCTLD)
    return args


def _in_instance(
    driver: SshDriver,
    client: paramiko.SSHClient,
    spec: InstanceSpec,
    node: NodeTarget,
    template: str,
    args: dict[str, Any],
) -> None:
    _in_instance_script(driver, client, spec, node, render(template, **args))


def _in_instance_script(
    driver: SshDriver, client: paramiko.SSHClient, spec: InstanceSpec, node: NodeTarget, script: str
) -> None:
    """``script`` (rendered) by ``sh`` inside the instance's namespaces on ``node``."""

    root = driver._paths(spec, node).root
    result = driver.run(
        client, node, CMD_IN_INSTANCE, check=False, pid=f"{root}/pid", nsenter=NSENTER, root=root,
        sh=SH, script=script, log=None,
    )  # fmt: skip
    if result.exit_status != 0:
        raise DriverError(
            "slurm_failed",
            f"{node.hostname}: exit {result.exit_status}: {result.stderr.strip()[-300:]}",
        )


def _detect_version(driver: SshDriver, spec: InstanceSpec, setup: SlurmSetup) -> str:
    """The REST dialect: what ``GET /openapi/v3`` lists that this console speaks (the daemon
    may take a moment to listen after its start)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            answer = request(driver, spec, setup, "GET", "/openapi/v3", None, "")
            break
        except DriverError as exc:
            if time.monotonic() > deadline or exc.code not in ("port_closed", "slurm_unreachable"):
                raise DriverError("slurm_failed", f"slurmrestd: {exc.detail or exc.code}") from None
            time.sleep(0.2)
    version = detect_api((answer.body.get("paths") or {}).keys())
    if not version:
        raise DriverError("slurm_failed", "slurmrestd speaks no REST version this console knows")
    return version


def request(
    driver: SshDriver,
    spec: InstanceSpec,
    setup: SlurmSetup,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    token: str,
) -> RestAnswer:
    """One HTTP exchange with rank 0's slurmrestd over the console's pinned connection."""
    node = spec.nodes[0]
    raw = http_request(method, path, body, setup.user, token or "-")
    chan = driver.open_tunnel(spec, node, setup.restd_port)
    data = bytearray()
    try:
        chan.settimeout(driver.settings.command_timeout)
        chan.sendall(raw)
        while len(data) < MAX_ANSWER_BYTES:
            chunk = chan.recv(65536)
            if not chunk:
                break
            data += chunk
            if answer_complete(bytes(data)):
                break
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise DriverError("slurm_unreachable", f"{node.hostname}: slurmrestd: {exc}") from None
    finally:
        chan.close()
    return parse_http_answer(bytes(data))


def output(
    driver: SshDriver, spec: InstanceSpec, setup: SlurmSetup, job_id: int, offset: int, limit: int
) -> OutputChunk:
    """Bytes of a job's output file (on /pfs: rank 0 reads it whichever node ran the batch step)."""
    node = spec.nodes[0]
    path = paths(driver, spec, setup).output(job_id)
    result = driver.run_on(
        node,
        CMD_READ_JOB_OUTPUT + "; printf '\\n%s' \"$(stat -c %s {path} 2>/dev/null || echo 0)\" >&2",
        {"start": int(offset) + 1, "path": path, "limit": int(limit)},
        check=False,
    )
    size_text = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "0"
    size = int(size_text) if size_text.isdigit() else 0
    text = result.stdout
    # Cut at the last whole line unless the file ended there: a line is shown once, whole.
    if int(offset) + len(text.encode()) < size and "\n" in text:
        text = text[: text.rindex("\n") + 1]
    return OutputChunk(text, int(offset) + len(text.encode()), size)


def remove(driver: SshDriver, client: paramiko.SSHClient, node: NodeTarget, run: str) -> None:
    driver.run(client, node, CMD_REMOVE_SLURM, run=run, log=None)


def describe(answer: RestAnswer) -> str:
    return json.dumps(answer.body.get("errors") or [], ensure_ascii=False)[:300]
