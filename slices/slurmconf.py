"""A slice's own Slurm (issue 31), the pure part: its files, its tokens, its REST dialect.

The console writes every file of a slice's Slurm (``slurm.conf``, ``gres.conf``,
``topology.conf``) from the allocation: one ``NodeName`` per node with its address, its port and
``Gres=gpu:<type>:<n>``; one leaf switch per scalable unit in ``topology.conf`` so Slurm's own
placement inside the slice follows the fabric. Every path in them is the same on every node
(``SlurmPaths``): Slurm checks that its nodes share one ``slurm.conf``.

What Debian's Slurm 22.05 needs to run in a tenant's instance without cgroups or systemd (found
on the test hosts): ``SlurmdParameters=config_overrides`` (8 GPUs declared on a 2-core machine),
``ProctrackType=proctrack/pgid``, ``TaskPlugin=task/none``, ``JobAcctGatherType=
jobacct_gather/none``; ``SlurmctldHost=localhost(<address>)`` (slurmctld accepts "localhost" as
its own name whatever the machine is called; the nodes reach it at the address); munge on a
socket of the slice's own (``AuthInfo=socket=``), so several slices share a machine (the test
hosts); several ``slurmd -N <name>`` per machine, one port each.

The console reaches slurmrestd with a JWT it mints per request (``mint_jwt``, HS256 over the
slice's key, the instance's user as ``sun``). ``RestApi`` is the one place that knows the REST
dialect: ``v0.0.38`` (22.05) today; a later version is another subclass keyed on what
``GET /openapi/v3`` lists (``detect_api``).

Pure: no Django (the import-linter contract "Pure modules import no Django").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A node's Slurm name is its fleet hostname; a GRES type is the GPU model's code, lower case.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")
GRES_TYPE = re.compile(r"[a-z0-9][a-z0-9_]{0,31}")
CLUSTER_NAME = re.compile(r"[a-z][a-z0-9]{0,39}")
# Ports a slice's daemons take: slurmctld, slurmrestd, then one slurmd per node.
PORTS_PER_SLICE = 200
MAX_NODES = PORTS_PER_SLICE - 2
# A job's name and environment, as the API takes them (data: never a shell's).
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Names the console sets in a job's environment (a job may not set them).
RESERVED_ENV = frozenset({"PATH", "HOME", "SLURM_CONF"})
MAX_SCRIPT_BYTES = 64 * 1024
MAX_TIME_LIMIT_MIN = 30 * 24 * 60


def gres_type(gpu_model_code: str) -> str:
    """The GRES type of a GPU model's code: "H100-SXM" → "h100_sxm"."""
    name = re.sub(r"[^a-z0-9]+", "_", gpu_model_code.lower()).strip("_")[:32] or "gpu"
    return name if GRES_TYPE.fullmatch(name) else "gpu"


def cluster_name(short_id: str) -> str:
    """Slurm's ClusterName for an instance (letters and digits, a letter first)."""
    name = "gpc" + re.sub(r"[^a-z0-9]", "", short_id.lower())
    return name[:40]


@dataclass(frozen=True)
class SlurmNode:
    """One node of the slice as Slurm sees it."""

    name: str  # NodeName: the fleet hostname
    address: str  # NodeAddr
    port: int  # its slurmd's port
    gpus: tuple[int, ...]  # the node's GPUs of the allocation (device numbers)
    leaf: str  # the leaf switch (the scalable unit) it hangs off
    cpus: int = 8


@dataclass(frozen=True)
class SlurmPaths:
    """Where a slice's Slurm lives on a node, the same on every node (``run`` is node-local,
    ``state`` and ``jobs`` on the slice's parallel file system)."""

    run: str  # config, keys, sockets, spool, logs: <SLICES_SLURM_RUN_DIR>/<slug>
    state: str  # slurmctld's StateSaveLocation: on /pfs, so a restarted rank 0 keeps the queue
    jobs: str  # job output and working directory: on /pfs, readable from every node

    @property
    def conf(self) -> str:
        return f"{self.run}/slurm.conf"

    @property
    def munge_key(self) -> str:
        return f"{self.run}/munge.key"

    @property
    def munge_socket(self) -> str:
        return f"{self.run}/munge.sock"

    @property
    def jwt_key(self) -> str:
        return f"{self.run}/jwt.key"

    def device_dir(self, node: str) -> str:
        """Stand-ins for /dev/nvidiaN on a host without GPUs (links to /dev/null)."""
        return f"{self.run}/dev/{node}"

    def output(self, job_id: int) -> str:
        return f"{self.jobs}/slurm-{int(job_id)}.out"


@dataclass(frozen=True)
class SlurmLayout:
    """Everything ``slurm.conf``, ``gres.conf`` and ``topology.conf`` say about one slice."""

    cluster: str
    controller_address: str
    ctld_port: int
    nodes: tuple[SlurmNode, ...]
    gres_type: str
    paths: SlurmPaths
    # device files per node name ("" = the real /dev/nvidiaN); stand-ins on the test hosts
    stand_in_devices: bool = False

    def __post_init__(self) -> None:
        if not CLUSTER_NAME.fullmatch(self.cluster):
            raise ValueError(f"cluster name {self.cluster!r}")
        if not GRES_TYPE.fullmatch(self.gres_type):
            raise ValueError(f"GRES type {self.gres_type!r}")
        if not self.nodes or len(self.nodes) > MAX_NODES:
            raise ValueError(f"{len(self.nodes)} nodes")
        for node in self.nodes:
            if not NODE_NAME.fullmatch(node.name) or not NODE_NAME.fullmatch(node.leaf):
                raise ValueError(f"node name {node.name!r} / leaf {node.leaf!r}")
            if not re.fullmatch(r"[A-Za-z0-9.:-]{1,253}", node.address):
                raise ValueError(f"node address {node.address!r}")

    def device_files(self, node: SlurmNode) -> list[str]:
        if self.stand_in_devices:
            return [f"{self.paths.device_dir(node.name)}/nvidia{g}" for g in node.gpus]
        return [f"/dev/nvidia{g}" for g in node.gpus]


def slurm_conf(layout: SlurmLayout) -> str:
    """``slurm.conf`` for the slice (identical on every node)."""
    p = layout.paths
    lines = [
        "# Written by the GPU console for this slice; every node has the same file.",
        f"ClusterName={layout.cluster}",
        f"SlurmctldHost=localhost({layout.controller_address})",
        f"SlurmctldPort={layout.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={p.munge_socket}",
        "CredType=cred/munge",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={p.jwt_key}",
        f"StateSaveLocation={p.state}",
        f"SlurmdSpoolDir={p.run}/spool/%n",
        f"SlurmctldPidFile={p.run}/slurmctld.pid",
        f"SlurmdPidFile={p.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={p.run}/log/slurmctld.log",
        f"SlurmdLogFile={p.run}/log/slurmd-%n.log",
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "TopologyPlugin=topology/tree",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=5",
        "DebugFlags=NO_CONF_HASH",
        # The daemons listen on the slice's own addresses only (slurmctld on rank 0's, each
        # slurmd on its NodeAddr), never on every interface of the node (README "Slurm and
        # jobs", the isolation rule).
        "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
    ]
    for node in layout.nodes:
        gres = f" Gres=gpu:{layout.gres_type}:{len(node.gpus)}" if node.gpus else ""
        lines.append(
            f"NodeName={node.name} NodeAddr={node.address} NodeHostname={node.name} "
            f"Port={node.port} CPUs={node.cpus}{gres} State=UNKNOWN"
        )
    lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def gres_conf(layout: SlurmLayout) -> str:
    """``gres.conf``: each node's GPUs as device files (the allocation's, in order)."""
    lines = ["# Written by the GPU console: the allocation's GPUs of each node."]
    for node in layout.nodes:
        for path in layout.device_files(node):
            lines.append(f"NodeName={node.name} Name=gpu Type={layout.gres_type} File={path}")
    return "\n".join(lines) + "\n"


def topology_conf(layout: SlurmLayout) -> str:
    """``topology.conf``: a switch per leaf (scalable unit), a spine over them; Slurm then
    places a job's nodes under as few leaves as it can."""
    leaves: dict[str, list[str]] = {}
    for node in layout.nodes:
        leaves.setdefault(node.leaf, []).append(node.name)
    lines = ["# Written by the GPU console from the fabric: one switch per leaf."]
    for leaf, names in leaves.items():
        lines.append(f"SwitchName={leaf} Nodes={','.join(names)}")
    lines.append(f"SwitchName=spine Switches={','.join(leaves)}")
    return "\n".join(lines) + "\n"


# -- tokens ----------------------------------------------------------------------------------


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def mint_jwt(key: bytes, user: str, now: int, lifetime_s: int = 60) -> str:
    """A token slurmctld accepts for ``user`` (HS256 over the slice's JWT key; ``sun`` is the
    user name), valid ``lifetime_s`` seconds from ``now``."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"iat": int(now), "exp": int(now) + int(lifetime_s), "sun": user}
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = _b64(hmac.new(key, header + b"." + payload, hashlib.sha256).digest())
    return (header + b"." + payload + b"." + signature).decode()


# -- jobs --------------------------------------------------------------------------------------


# Slurm's job states, as the console groups them (squeue's long names).
QUEUED, RUNNING, DONE = "queued", "running", "done"
STATE_GROUPS: dict[str, str] = {
    "PENDING": QUEUED,
    "CONFIGURING": QUEUED,
    "REQUEUED": QUEUED,
    "REQUEUE_HOLD": QUEUED,
    "REQUEUE_FED": QUEUED,
    "RESV_DEL_HOLD": QUEUED,
    "SUSPENDED": RUNNING,
    "RUNNING": RUNNING,
    "COMPLETING": RUNNING,
    "STAGE_OUT": RUNNING,
    "SIGNALING": RUNNING,
    "RESIZING": RUNNING,
    "COMPLETED": DONE,
    "CANCELLED": DONE,
    "FAILED": DONE,
    "TIMEOUT": DONE,
    "NODE_FAIL": DONE,
    "PREEMPTED": DONE,
    "BOOT_FAIL": DONE,
    "DEADLINE": DONE,
    "OUT_OF_MEMORY": DONE,
    "REVOKED": DONE,
    "SPECIAL_EXIT": DONE,
}


def state_group(state: str) -> str:
    """queued, running or done for one of Slurm's job states (unknown ones count as queued)."""
    return STATE_GROUPS.get(state.upper(), QUEUED)


@dataclass(frozen=True)
class JobRequest:
    """A job as the console submits it: all data, no shell sees any of it on the way."""

    script: str
    name: str
    nodes: int
    gpus_per_node: int
    time_limit_min: int
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobStatus:
    """One job as Slurm reports it (the fields the console keeps)."""

    job_id: int
    name: str
    state: str  # Slurm's (PENDING, RUNNING, COMPLETED...)
    reason: str  # Slurm's pending reason code ("Resources", "Priority", "None")
    nodes: str  # Slurm's node list expression ("n[0-1]")
    submit_time: int
    start_time: int
    end_time: int
    exit_code: int | None


class RestApi:
    """The REST dialect of one slurmrestd version: paths, the submit body, a job's fields."""

    version = ""

    def ping_path(self) -> str:
        raise NotImplementedError

    def submit_path(self) -> str:
        raise NotImplementedError

    def jobs_path(self) -> str:
        raise NotImplementedError

    def job_path(self, job_id: int) -> str:
        raise NotImplementedError

    def submit_body(self, req: JobRequest, workdir: str, output: str, path: str) -> dict[str, Any]:
        raise NotImplementedError

    def parse_jobs(self, body: Mapping[str, Any]) -> list[JobStatus]:
        raise NotImplementedError

    def submitted_id(self, body: Mapping[str, Any]) -> int | None:
        raise NotImplementedError

    def errors(self, body: Mapping[str, Any]) -> list[str]:
        out = []
        for err in body.get("errors") or ():
            if isinstance(err, Mapping):
                out.append(str(err.get("error") or err.get("description") or err))
        return out


def _int(value: Any) -> int:
    if isinstance(value, Mapping):  # v0.0.39+: {"set": true, "number": 5}
        value = value.get("number", 0) if value.get("set", True) else 0
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


class RestApi0038(RestApi):
    """slurmrestd 22.05's ``openapi/v0.0.38`` (the only plugin that needs no slurmdbd)."""

    version = "v0.0.38"

    def ping_path(self) -> str:
        return "/slurm/v0.0.38/ping"

    def submit_path(self) -> str:
        return "/slurm/v0.0.38/job/submit"

    def jobs_path(self) -> str:
        return "/slurm/v0.0.38/jobs"

    def job_path(self, job_id: int) -> str:
        return f"/slurm/v0.0.38/job/{int(job_id)}"

    def submit_body(self, req: JobRequest, workdir: str, output: str, path: str) -> dict[str, Any]:
        env = {**dict(req.environment), "PATH": path}
        job: dict[str, Any] = {
            "name": req.name,
            "nodes": req.nodes,
            "time_limit": req.time_limit_min,
            "current_working_directory": workdir,
            "standard_output": output,
            "standard_error": output,
            "environment": env,
            "requeue": True,
        }
        if req.gpus_per_node:
            job["gpus_per_node"] = str(req.gpus_per_node)
        return {"script": req.script, "job": job}

    def submitted_id(self, body: Mapping[str, Any]) -> int | None:
        value = body.get("job_id")
        return int(value) if isinstance(value, int) else None

    def parse_jobs(self, body: Mapping[str, Any]) -> list[JobStatus]:
        out = []
        for job in body.get("jobs") or ():
            if not isinstance(job, Mapping) or not isinstance(job.get("job_id"), int):
                continue
            state = job.get("job_state") or ""
            if isinstance(state, list):  # v0.0.40: a list of flags
                state = state[0] if state else ""
            exit_code = job.get("exit_code")
            out.append(
                JobStatus(
                    job_id=int(job["job_id"]),
                    name=str(job.get("name") or ""),
                    state=str(state).upper(),
                    reason=str(job.get("state_reason") or ""),
                    nodes=str(job.get("nodes") or ""),
                    submit_time=_int(job.get("submit_time")),
                    start_time=_int(job.get("start_time")),
                    end_time=_int(job.get("end_time")),
                    exit_code=_int(exit_code) if exit_code is not None else None,
                )
            )
        return out


API_VERSIONS: dict[str, type[RestApi]] = {RestApi0038.version: RestApi0038}
DEFAULT_API = RestApi0038.version


def detect_api(openapi_paths: Iterable[str]) -> str:
    """The newest dialect this console speaks among the paths ``GET /openapi/v3`` lists."""
    found = {m.group(1) for p in openapi_paths if (m := re.match(r"/slurm/(v[0-9.]+)/", p))}
    known = [v for v in API_VERSIONS if v in found]
    return max(known, key=lambda v: tuple(int(x) for x in v[1:].split("."))) if known else ""


def api(version: str) -> RestApi:
    return API_VERSIONS.get(version or DEFAULT_API, RestApi0038)()


def check_environment(env: Mapping[str, Any]) -> dict[str, str]:
    """A job's environment as data: names matched whole, values without NUL; the console's own
    names refused (ValueError naming the first bad one)."""
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name) or name in RESERVED_ENV:
            raise ValueError(str(name))
        if name.startswith("SLURM_"):
            raise ValueError(name)
        text = str(value)
        if "\x00" in text or len(text) > 4096:
            raise ValueError(name)
        out[name] = text
    return out


def script_ok(script: str) -> bool:
    """A batch script Slurm takes: starts with ``#!``, no NUL, bounded."""
    return (
        script.startswith("#!")
        and "\x00" not in script
        and len(script.encode()) <= MAX_SCRIPT_BYTES
    )


def node_names(nodes: Sequence[SlurmNode]) -> list[str]:
    return [n.name for n in nodes]
