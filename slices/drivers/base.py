"""The one interface to the nodes: small dataclasses in and out, no ORM (Horizon's api/nova.py).

A driver runs one provisioning step on one node per call; the service calls it from worker
threads, one thread per node, and records what it returns. Errors say whether retrying can help
(``DriverError.permanent``), as Healthchecks' transports do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# Environment variable names (always ``ENV_NAME.fullmatch``): re-exported for the drivers.
from slices.envpolicy import ENV_NAME as ENV_NAME

# Log sink: the driver calls it with each line it wants the user to see (thread-safe in services).
LogFn = Callable[[str], None]


@dataclass(frozen=True)
class Mount:
    """A read-only mount: a marketplace asset served from the parallel file system."""

    source: (
        str  # path relative to the asset root on the PFS, e.g. "models/meta-llama/Llama-2-7b-hf"
    )
    target: str  # absolute path in the instance, e.g. "/models/Llama-2-7b-hf"


@dataclass(frozen=True)
class DiskMount:
    """A persistent cloud disk attached to the instance (network block storage in its region)."""

    disk_id: str  # the disk's public id (the volume's name on the storage side)
    target: str  # /data/disk-<short id>
    read_only: bool
    size_gb: int


@dataclass(frozen=True)
class NodeTarget:
    """One node of an instance, as the driver needs it."""

    hostname: str
    address: str
    port: int
    host_key: str  # pinned: the host key line or its SHA256 fingerprint
    rank: int
    gpus: tuple[int, ...]
    workdir: str = "/var/lib/gpu-console"
    runtime: str = "docker"  # docker | enroot | process (no container runtime: the test hosts)
    node_gpus: int = 0  # the node's GPUs, all of them (0 = unknown: never taken as the whole node)
    # A host one tenant uses at a time (the test hosts): the only place a bare process may run
    # beside others, since nothing isolates it (``Node.layout["single_tenant"]``).
    single_tenant: bool = False
    # The instance's own sshd on this node (``InstanceNode.ssh_port``), reached through the
    # region's gateway; 0 = none (the runtime gives none, or no port was free).
    instance_ssh_port: int = 0

    @property
    def exclusive(self) -> bool:
        """The instance holds every GPU of the node (a whole host, or a node of a slice): no
        other tenant can be placed on it, so it may use the host's network and IPC."""
        return self.node_gpus > 0 and len(self.gpus) == self.node_gpus


@dataclass(frozen=True)
class InstanceSpec:
    """What every node of one instance is prepared with."""

    instance_id: str  # the public UUID
    slug: str  # gpc-<short id>: directory and container name on the nodes
    name: str  # the user's name for it (free text: only ever passed quoted)
    owner: str  # the account's public id (the PFS directory)
    image: str  # container image reference ("" = bare host)
    entrypoint: str  # the image's entrypoint command ("" = sleep)
    env: dict[str, str]
    mounts: tuple[Mount, ...]
    ssh_public_key: str
    nodes: tuple[NodeTarget, ...]
    gpus_per_node: int
    partition_key: int | None = None
    master_port: int = 29500
    sim_fail: str = ""  # sim driver only: "<step>" or "<step>@<rank>" fails that step
    disks: tuple[DiskMount, ...] = ()
    system_disk_gb: int = 0
    # The image's service ports (catalogue data): published per instance on a shared node.
    ports: tuple[int, ...] = ()
    # What the image version says it holds (catalogue data: ``python``, ``cuda``, ``torch``,
    # ``framework``); empty for a bare host. The simulated shell answers from it (issue 29).
    software: tuple[tuple[str, str], ...] = ()
    # The instance's sshd host key (OpenSSH private key text), the console's for the instance's
    # life, so the key a customer pinned stays valid on any node it runs on (issue 29). Never in
    # a repr (a spec may be logged); "" = the node makes one.
    ssh_host_key: str = field(default="", repr=False)
    # The slice's own Slurm (issue 31): its node-local directory ("" = no Slurm), the same on
    # every node; the instance's SLURM_CONF points into it.
    slurm_run: str = ""

    @property
    def master_addr(self) -> str:
        return self.nodes[0].address if self.nodes else ""

    def job_env(self, node: NodeTarget) -> dict[str, str]:
        """The environment a distributed job needs on ``node`` (RunPod Instant Clusters' names):
        the instance's own (``env``) under what the console sets, which always wins."""
        console = {
            "INSTANCE_ID": self.instance_id,
            "INSTANCE_NAME": self.name,
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "NODE_RANK": str(node.rank),
            "NNODES": str(len(self.nodes)),
            "WORLD_SIZE": str(len(self.nodes) * self.gpus_per_node),
            "NPROC_PER_NODE": str(self.gpus_per_node),
            "NCCL_IB_HCA": "mlx5",
            "NCCL_SOCKET_IFNAME": "^lo,docker",
            "PFS": "/pfs",
        }
        if self.partition_key is not None:
            console["NCCL_IB_PKEY"] = str(self.partition_key)
        return {**self.env, **console}

    def hostfile(self) -> str:
        return "".join(f"{n.address} slots={len(n.gpus)}\n" for n in self.nodes)


@dataclass
class StepResult:
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkloadOutput:
    """New lines of what the instance's workload printed on a node (``workload_output``), and
    whether it is still running."""

    lines: list[str]
    running: bool


class DriverError(Exception):
    """A step failed. ``permanent`` = retrying cannot help (bad host key, missing image...)."""

    def __init__(self, code: str, detail: str = "", *, permanent: bool = False) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail
        self.permanent = permanent


class TelemetrySource(Protocol):
    """One node's GPU samples while an instance runs: the agent's stream (ssh) or the workload
    model (sim). ``read`` is called by the relay once a second and never blocks."""

    simulated: bool

    def read(self, now: float) -> dict[str, Any] | None:
        """The node's latest sample in the agent's line format (``slices.agent.nvml_agent``), or
        None when nothing new arrived since the last call."""
        ...

    def close(self) -> None:
        """Stop sampling (the agent process ends with its SSH channel); idempotent."""
        ...


class TelemetryDriver(Protocol):
    """A driver that can sample the GPUs of a running instance's nodes."""

    def telemetry(
        self, spec: InstanceSpec, node: NodeTarget, gpu_model: str
    ) -> TelemetrySource: ...


class NodeDriver(Protocol):
    """One method per operation. ``simulated`` drivers are labelled as such in the UI."""

    name: str
    simulated: bool

    def step_seconds(self) -> dict[str, float]:
        """Expected seconds per step (for the ETA)."""
        ...

    def isolate(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        """Put the instance's nodes in their own fabric partition (``spec.partition_key``)."""
        ...

    def connect(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult: ...

    def prepare(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult: ...

    def mount(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult: ...

    def start(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult: ...

    def health(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult: ...

    def allreduce_check(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        """A slice's all-reduce across its nodes; data: busbw_gbps, latency_us (or measured=False)."""
        ...

    def teardown(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        """Stop everything of the instance on the node (the process rule: whatever any door
        started in it, daemonised or not; SECURITY.md) and remove its mounts; idempotent."""
        ...


class ProbeDriver(Protocol):
    """A node's heartbeat as the console takes it (SECURITY.md "Node health"): the node itself
    answers, over the console's pinned connection (ssh) or as the simulated fleet plays it."""

    def probe(self, node: NodeTarget) -> StepResult:
        """Ask ``node`` whether it is alive, within the connect timeout; ``data``: what it said
        (its uptime). Raises ``DriverError`` when it does not answer."""
        ...


class StopDriver(Protocol):
    """关机/开机: stop an instance's container keeping its system disk (the instance directory),
    and move that disk to another node when it starts elsewhere."""

    def stop(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        """Stop everything that runs for the instance on the node (the process rule, as
        ``teardown``); keep its directory; idempotent."""
        ...

    def move_disk(
        self, spec: InstanceSpec, src: NodeTarget, dst: NodeTarget, log: LogFn
    ) -> StepResult:
        """Copy the instance's system disk from ``src`` to ``dst`` (start on another host)."""
        ...


# -- reaching an instance (issue 19): the SSH gateway, a terminal, a TCP tunnel ------------------
@dataclass(frozen=True)
class GatewayTarget:
    """A region's SSH gateway as the driver needs it (``slices.models.Gateway``)."""

    host: str  # public name customers use
    port: int  # public SSH port
    user: str  # the jump user
    address: str  # the console's management address
    ssh_port: int
    host_key: str  # pinned: the host key line or its SHA256 fingerprint
    keys_file: str  # the jump user's authorized_keys, which the console owns
    # The forwarder's routes file ("" = the gateway forwards no ports) and what it holds: each
    # instance's public port to where its sshd runs now (issue 29).
    routes_file: str = ""
    routes: tuple[GatewayRoute, ...] = ()


@dataclass(frozen=True)
class GatewayRoute:
    """One forwarded port of a gateway: ``port`` (public, the instance's for its life) to the
    instance's sshd where it runs now (``address:dest_port``)."""

    port: int
    address: str
    dest_port: int
    label: str = ""  # the instance's slug, for operators reading the file


@dataclass(frozen=True)
class GatewayGrant:
    """One customer key let through a gateway, and the only places it may forward to (the
    instance sshd ports of that key's owner's running instances in the region: one owner per
    key, ``slices.services.access.gateway_grants``)."""

    public_key: str  # "<type> <base64>": rebuilt by the console, never the customer's line
    destinations: tuple[tuple[str, int], ...]  # (node address, instance sshd port)
    label: str = ""  # the owner's public id: the line's comment, for operators reading the file


class Shell(Protocol):
    """An interactive terminal (a PTY) in an instance on one node. ``send``, ``resize`` and
    ``close`` may be called from one thread while another waits in ``recv``."""

    simulated: bool

    def send(self, data: bytes) -> None:
        """Keystrokes (bytes as the terminal sends them; UTF-8 for text). Raises
        ``DriverError`` when the terminal is gone."""
        ...

    def recv(self, timeout: float) -> bytes | None:
        """What the terminal printed since the last call, waiting up to ``timeout`` seconds for
        something (b"" = nothing yet; None = it ended)."""
        ...

    def resize(self, cols: int, rows: int) -> None: ...

    def close(self) -> None:
        """End the terminal (what runs in it gets a hangup); idempotent."""
        ...


class Tunnel(Protocol):
    """A byte stream to a TCP port of an instance, as seen from its node (a paramiko
    ``direct-tcpip`` channel on the ssh driver): socket-like."""

    def sendall(self, data: bytes) -> None: ...

    def send(self, data: bytes) -> int: ...

    def recv(self, size: int) -> bytes: ...

    def settimeout(self, timeout: float | None) -> None: ...

    def fileno(self) -> int:
        """Readable when data (or the end) is waiting: the proxy waits on it in its event loop."""
        ...

    def close(self) -> None: ...


class AccessDriver(Protocol):
    """How customers reach their instances: the gateway's keys, a terminal, web ports."""

    def sync_gateway(
        self, gateway: GatewayTarget, grants: tuple[GatewayGrant, ...], log: LogFn
    ) -> StepResult:
        """Write the gateway's whole authorized_keys from ``grants`` (atomic; idempotent)."""
        ...

    def open_shell(
        self, spec: InstanceSpec, node: NodeTarget, cols: int, rows: int, *, gpu_model: str = ""
    ) -> Shell:
        """A login shell in the instance on ``node`` with a ``cols`` × ``rows`` PTY, opened over
        the console's pinned connection (``gpu_model``: the fleet code, for the sim driver's
        answers). What it starts belongs to the instance and ends with it (the process rule).
        Raises ``DriverError`` when the node cannot be reached."""
        ...

    def open_tunnel(self, spec: InstanceSpec, node: NodeTarget, port: int) -> Tunnel:
        """A stream to ``127.0.0.1:<port>`` as ``node`` sees it, over the console's pinned
        connection; nothing is opened on the node's public interfaces. The caller passes the
        node-side port: the host port docker published on a shared node
        (``InstanceNode.published_ports``), else the instance's port itself. It reaches the
        instance's own processes only: ``DriverError`` ``port_not_instance`` when anything else
        listens there (another tenant, the node's services), ``port_closed`` when nothing
        does."""
        ...
