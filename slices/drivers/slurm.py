"""What a driver that runs a slice's Slurm takes and gives (issue 31): small dataclasses, no ORM.

A driver declares ``slurm`` in ``slices.drivers.registry`` and implements ``SlurmDriver``: the ssh
driver starts Debian's real daemons inside the tenant's instance (``slices.drivers.ssh.slurm``);
the simulated fleet plays a simulated Slurm with the same job semantics
(``slices.drivers.sim_slurm``). The console reaches slurmrestd only through the driver
(``slurm_request``): over its pinned SSH connection to rank 0, never a node port.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from slices.drivers.base import DriverError, InstanceSpec, LogFn, StepResult
from slices.slurmconf import SlurmLayout, SlurmNode, SlurmPaths


@dataclass(frozen=True)
class SlurmSetup:
    """One slice's Slurm, as the console decided it: names, ports and the two keys."""

    cluster: str  # ClusterName
    base_port: int  # slurmctld; slurmrestd on +1; each node's slurmd on +2+its offset
    gres_type: str  # "h100"
    leaves: tuple[str, ...]  # each rank's leaf switch (its scalable unit)
    user: str  # the instance's user: whose jobs, whose tokens
    run_root: str  # SLICES_SLURM_RUN_DIR: node-local, <run_root>/<slug> for this slice
    api_version: str = ""  # the REST dialect slurmrestd speaks (found at start)
    munge_key: bytes = field(default=b"", repr=False)
    jwt_key: bytes = field(default=b"", repr=False)
    cpus_per_node: int = 8
    # Each node's slurmd port offset (from +2), by hostname: kept for a node's life in the slice,
    # so a replacement never takes the port of the node it replaces (whose slurmd may still run).
    node_offsets: tuple[tuple[str, int], ...] = ()

    @property
    def ctld_port(self) -> int:
        return self.base_port

    @property
    def restd_port(self) -> int:
        return self.base_port + 1

    def node_port(self, hostname: str, rank: int) -> int:
        offsets = dict(self.node_offsets)
        return self.base_port + 2 + offsets.get(hostname, rank)

    def layout(self, spec: InstanceSpec, pfs: str, *, stand_in_devices: bool) -> SlurmLayout:
        """Slurm's view of the slice (``pfs``: the account's directory as nodes see it)."""
        if len(self.leaves) != len(spec.nodes):
            raise DriverError("slurm_failed", "one leaf per node is needed", permanent=True)
        nodes = tuple(
            SlurmNode(
                name=n.hostname,
                address=n.address,
                port=self.node_port(n.hostname, n.rank),
                gpus=n.gpus,
                leaf=self.leaves[i],
                cpus=self.cpus_per_node,
            )
            for i, n in enumerate(spec.nodes)
        )
        paths = SlurmPaths(
            run=f"{self.run_root}/{spec.slug}",
            state=f"{pfs}/.slurm/{spec.slug}/state",
            jobs=f"{pfs}/.slurm/{spec.slug}/jobs",
        )
        try:
            return SlurmLayout(
                cluster=self.cluster,
                controller_address=spec.nodes[0].address,
                ctld_port=self.ctld_port,
                nodes=nodes,
                gres_type=self.gres_type,
                paths=paths,
                stand_in_devices=stand_in_devices,
            )
        except ValueError as exc:
            raise DriverError("bad_identifier", f"Slurm: {exc}", permanent=True) from None


@dataclass(frozen=True)
class RestAnswer:
    """slurmrestd's answer: the HTTP status and the JSON body ({} when it was not JSON)."""

    status: int
    body: dict[str, Any]


@dataclass(frozen=True)
class OutputChunk:
    """Bytes of a job's output file from an offset; ``size``: the file's size now."""

    text: str
    next_offset: int
    size: int


class SlurmDriver(Protocol):
    def start_slurm(self, spec: InstanceSpec, setup: SlurmSetup, log: LogFn) -> StepResult:
        """Write the slice's Slurm files on every node (keys as data, tight modes), start munge
        and slurmd on every node and slurmctld and slurmrestd on rank 0 inside the instance,
        and wait until every node is idle. ``data``: ``api_version``, ``nodes``. Idempotent."""
        ...

    def slurm_request(
        self,
        spec: InstanceSpec,
        setup: SlurmSetup,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        token: str,
    ) -> RestAnswer:
        """One request to the slice's slurmrestd with ``token`` (minted by the console)."""
        ...

    def slurm_output(
        self, spec: InstanceSpec, setup: SlurmSetup, job_id: int, offset: int, limit: int
    ) -> OutputChunk:
        """A job's output file (on /pfs) from byte ``offset``, at most ``limit`` bytes."""
        ...

    def slurm_paths(self, spec: InstanceSpec, setup: SlurmSetup) -> SlurmPaths:
        """Where the slice's Slurm lives on its nodes (the jobs' directory, the config)."""
        ...


# -- HTTP/1.1 over a byte stream (the SSH channel to slurmrestd) --------------------------------

MAX_ANSWER_BYTES = 32 * 1024 * 1024


def http_request(
    method: str, path: str, body: dict[str, Any] | None, user: str, token: str
) -> bytes:
    """One request, closed after the answer. The header values are the console's (a token, a
    user name it checked), never a tenant's text."""
    payload = json.dumps(body).encode() if body is not None else b""
    if any(any(c in value for c in "\r\n\x00 \t") for value in (method, path, user, token)):
        raise DriverError("bad_identifier", "a request line or header value", permanent=True)
    head = [
        f"{method} {path} HTTP/1.1",
        "Host: localhost",
        f"X-SLURM-USER-NAME: {user}",
        f"X-SLURM-USER-TOKEN: {token}",
        "Accept: application/json",
        "Connection: close",
    ]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


def parse_http_answer(raw: bytes) -> RestAnswer:
    """The status and JSON body of an HTTP/1.1 answer read to its end (``Content-Length`` or
    the connection's close)."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise DriverError("slurm_unreachable", "slurmrestd sent no complete answer")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise DriverError("slurm_unreachable", f"slurmrestd answered {lines[0][:80]!r}") from None
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        rest = _dechunk(rest)
    elif "content-length" in headers:
        rest = rest[: int(headers["content-length"])]
    try:
        parsed = json.loads(rest.decode() or "{}")
    except (UnicodeDecodeError, ValueError):
        parsed = {}
    return RestAnswer(status, parsed if isinstance(parsed, dict) else {})


def answer_complete(raw: bytes) -> bool:
    """Whether ``raw`` holds a whole answer with a ``Content-Length`` (else read to the close)."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            return len(rest) >= int(value.strip())
    return False


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return bytes(out)
