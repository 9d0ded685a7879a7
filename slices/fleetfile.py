"""Read and check a fleet file (YAML); every error names the line and the reason. No Django.

Format (see slices/fleets/shipped.yaml for the full, commented example)::

    version: 1
    gpu_models:
      - {code: A800, memory_gib: 80, nvlink_gbps: 200}
    demand:                 # optional: order mix per model, GPUs -> weight (fragmentation)
      A800: {8: 2, 64: 4, 128: 3, 256: 1}
    regions:
      - code: yinchuan
        name: Yinchuan
        name_zh: 银川
        gateway:                # optional: the region's SSH gateway (jump host)
          host: gw-yinchuan.example.com   # public name customers reach
          port: 22                        # optional (22)
          user: gpc                       # optional (gpc): the jump user
          address: 10.20.0.2              # the console's management address
          ssh_port: 22                    # optional (22)
          host_key: "SHA256:..."          # pinned: fingerprint or "ssh-ed25519 AAAA..." line
          keys_file: /etc/gpc-gateway/authorized_keys   # optional: the jump user's keys
        clusters:
          - code: yc-a800-1
            gpu_model: A800
            fabric: ib-hdr          # ib-hdr | ib-ndr | ethernet
            gpus_per_node: 8
            nodes: 256
            su_nodes: 20            # full SUs of 20, the rest in a last, smaller SU (12 x 20 + 16)
            # or: scalable_units: [16, 16, 16, 16]
            hostname: "yc-a8-su{su:02d}-n{node:02d}"
            address: "10.20.{su}.{node}"
            host_keys: {"yc-a8-su01-n01": "SHA256:..."}   # optional pins
            runtime: docker         # optional: docker | enroot | process (default SLICES_NODE_RUNTIME)
            single_tenant: false    # optional: true only for hosts one tenant uses at a time

``runtime: process`` (no container: test hosts) needs ``single_tenant: true``: a bare process
shares the host's network, IPC, files and devices with whatever else runs there, so a node that
can hold more than one instance must not run it (the driver refuses it there too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from slices.topology import (
    FABRIC_ETHERNET,
    ClusterSpec,
    FleetSpec,
    GatewaySpec,
    GpuModelSpec,
    NodeSpec,
    RegionSpec,
    ScalableUnitSpec,
)

FABRICS = {"ib-hdr": (200, 40), "ib-ndr": (400, 64), FABRIC_ETHERNET: (100, 0)}
RUNTIMES = ("docker", "enroot", "process")  # slices.drivers.ssh.commands.RUNTIMES
CODE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
# A gateway's names end up in the command customers copy: plain DNS names and addresses only.
PUBLIC_HOST_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62})(\.[a-z0-9]([a-z0-9-]{0,62}))*$")
ADDRESS_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.:-]{0,253})$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
KEYS_FILE_RE = re.compile(r"^/[A-Za-z0-9._/+@-]{1,254}$")
HOST_KEY_RE = re.compile(
    r"^(SHA256:[A-Za-z0-9+/]{43}|(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) "
    r"AAAA[A-Za-z0-9+/]+={0,2})$"
)
DEFAULT_KEYS_FILE = "/etc/gpc-gateway/authorized_keys"
SHIPPED_FLEET = Path(__file__).resolve().parent / "fleets" / "shipped.yaml"


class FleetFileError(ValueError):
    def __init__(self, line: int, reason: str, source: str = "") -> None:
        self.line = line
        self.reason = reason
        self.source = source
        where = f"{source}:" if source else "line "
        super().__init__(f"{where}{line}: {reason}")


class _LDict(dict[Any, Any]):
    line: int = 0
    lines: dict[Any, int]


class _LList(list[Any]):
    line: int = 0
    lines: list[int]


class _Loader(yaml.SafeLoader):
    """A safe loader that remembers the line of every mapping key and list item."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> _LDict:
        d = _LDict()
        d.line = node.start_mark.line + 1
        d.lines = {}
        self.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in d:
                raise FleetFileError(key_node.start_mark.line + 1, f"duplicate key {key!r}")
            d[key] = self.construct_object(value_node, deep=True)
            d.lines[key] = key_node.start_mark.line + 1
        return d

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> _LList:
        lst = _LList(self.construct_object(child, deep=True) for child in node.value)
        lst.line = node.start_mark.line + 1
        lst.lines = [child.start_mark.line + 1 for child in node.value]
        return lst


_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _Loader.construct_sequence)


def _line(obj: Any, key: Any = None) -> int:
    if key is not None and isinstance(obj, _LDict):
        return obj.lines.get(key, obj.line)
    return getattr(obj, "line", 0)


_KIND_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "a mapping"}


def _get(
    d: _LDict, key: str, kind: type | tuple[type, ...], required: bool = True, default: Any = None
) -> Any:
    if key not in d:
        if required:
            raise FleetFileError(d.line, f"missing key {key!r}")
        return default
    value = d[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        kinds = (kind,) if isinstance(kind, type) else kind
        names = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
        raise FleetFileError(_line(d, key), f"{key!r} must be {names}, not {value!r}")
    return value


def _no_unknown(d: _LDict, allowed: set[str], what: str) -> None:
    for key in d:
        if key not in allowed:
            raise FleetFileError(_line(d, key), f"unknown key {key!r} in {what}")


def parse_fleet(text: str, source: str = "") -> FleetSpec:
    """Parse and validate fleet YAML; raise FleetFileError(line, reason) on the first problem."""
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader subclass
    except FleetFileError as exc:
        exc.source = source
        raise FleetFileError(exc.line, exc.reason, source) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise FleetFileError(line, f"not valid YAML: {exc.problem or exc}", source) from None
    try:
        return _build(doc)
    except FleetFileError as exc:
        raise FleetFileError(exc.line, exc.reason, source) from None


def load_fleet_file(path: str | Path) -> FleetSpec:
    path = Path(path)
    return parse_fleet(path.read_text(encoding="utf-8"), source=str(path))


def _build(doc: Any) -> FleetSpec:
    if not isinstance(doc, _LDict):
        raise FleetFileError(
            1, "the fleet file must be a mapping with version, gpu_models, regions"
        )
    _no_unknown(doc, {"version", "gpu_models", "demand", "regions"}, "the fleet file")
    version = _get(doc, "version", int)
    if version != 1:
        raise FleetFileError(_line(doc, "version"), f"unsupported version {version}; expected 1")

    models: dict[str, GpuModelSpec] = {}
    for i, m in enumerate(_get(doc, "gpu_models", list)):
        line = doc["gpu_models"].lines[i]
        if not isinstance(m, _LDict):
            raise FleetFileError(line, "a GPU model must be a mapping")
        _no_unknown(m, {"code", "memory_gib", "nvlink_gbps", "price_hint"}, "a GPU model")
        code = _get(m, "code", str)
        if not MODEL_RE.match(code):
            raise FleetFileError(_line(m, "code"), f"GPU model code {code!r} is not a simple name")
        if code in models:
            raise FleetFileError(_line(m, "code"), f"GPU model {code} declared twice")
        memory = _get(m, "memory_gib", int)
        if memory <= 0:
            raise FleetFileError(_line(m, "memory_gib"), "memory_gib must be positive")
        models[code] = GpuModelSpec(
            code, memory, _get(m, "nvlink_gbps", int, False, 0), str(m.get("price_hint", ""))
        )

    demand: dict[str, dict[int, float]] = {}
    raw_demand = _get(doc, "demand", dict, required=False, default=_LDict())
    for model, mix in raw_demand.items():
        if model not in models:
            raise FleetFileError(
                _line(raw_demand, model), f"demand for unknown GPU model {model!r}"
            )
        if not isinstance(mix, _LDict):
            raise FleetFileError(_line(raw_demand, model), "demand must map GPUs to a weight")
        demand[model] = {}
        for size, weight in mix.items():
            if (
                not isinstance(size, int)
                or not (size in (1, 2, 4, 8) or size % 64 == 0)
                or size <= 0
            ):
                raise FleetFileError(
                    _line(mix, size), f"demand size {size!r} is not 1, 2, 4, 8 or a multiple of 64"
                )
            if not isinstance(weight, int | float) or isinstance(weight, bool) or weight < 0:
                raise FleetFileError(_line(mix, size), f"weight {weight!r} must be a number ≥ 0")
            demand[model][size] = float(weight)

    regions: list[RegionSpec] = []
    clusters: list[ClusterSpec] = []
    seen_clusters: set[str] = set()
    seen_hosts: dict[str, int] = {}
    seen_addresses: dict[str, int] = {}
    raw_regions = _get(doc, "regions", list)
    if not raw_regions:
        raise FleetFileError(_line(doc, "regions"), "the fleet needs at least one region")
    for ri, r in enumerate(raw_regions):
        if not isinstance(r, _LDict):
            raise FleetFileError(raw_regions.lines[ri], "a region must be a mapping")
        _no_unknown(r, {"code", "name", "name_zh", "gateway", "clusters"}, "a region")
        code = _get(r, "code", str)
        if not CODE_RE.match(code):
            raise FleetFileError(
                _line(r, "code"), f"region code {code!r}: lowercase letters, digits, '-'"
            )
        if any(x.code == code for x in regions):
            raise FleetFileError(_line(r, "code"), f"region {code} declared twice")
        gateway = _gateway(r, code) if "gateway" in r else None
        regions.append(
            RegionSpec(code, _get(r, "name", str), _get(r, "name_zh", str, False, ""), gateway)
        )
        for c in _get(r, "clusters", list):
            if not isinstance(c, _LDict):
                raise FleetFileError(r.lines["clusters"], "a cluster must be a mapping")
            clusters.append(_cluster(c, code, models, seen_clusters, seen_hosts, seen_addresses))
    return FleetSpec(tuple(regions), tuple(models.values()), tuple(clusters), demand)


_GATEWAY_KEYS = {"host", "port", "user", "address", "ssh_port", "host_key", "keys_file", "ports"}
PORT_RANGE_RE = re.compile(r"^(\d{4,5})-(\d{4,5})$")


def _gateway(r: _LDict, region: str) -> GatewaySpec:
    """A region's ``gateway:`` block: every name checked, since the public ones end up verbatim
    in the command and the ``~/.ssh/config`` block customers copy."""
    g = r["gateway"]
    if not isinstance(g, _LDict):
        raise FleetFileError(_line(r, "gateway"), f"region {region}: gateway must be a mapping")
    _no_unknown(g, _GATEWAY_KEYS, "a gateway")
    host = _get(g, "host", str)
    if not PUBLIC_HOST_RE.match(host) or len(host) > 253:
        raise FleetFileError(
            _line(g, "host"), f"gateway host {host!r}: a DNS name (lowercase letters, digits, - .)"
        )
    address = _get(g, "address", str)
    if not ADDRESS_RE.match(address):
        raise FleetFileError(_line(g, "address"), f"gateway address {address!r} is not an address")
    user = _get(g, "user", str, False, "gpc")
    if not USER_RE.match(user):
        raise FleetFileError(_line(g, "user"), f"gateway user {user!r} is not a user name")
    ports = {}
    for key in ("port", "ssh_port"):
        ports[key] = _get(g, key, int, False, 22)
        if not 0 < ports[key] < 65536:
            raise FleetFileError(_line(g, key), f"gateway {key} {ports[key]} is out of range")
    host_key = " ".join(str(_get(g, "host_key", str, False, "")).split()[:2])
    if host_key and not HOST_KEY_RE.match(host_key):
        raise FleetFileError(
            _line(g, "host_key"),
            "the gateway's host key is pinned as SHA256:<base64> or as its public key line",
        )
    keys_file = _get(g, "keys_file", str, False, DEFAULT_KEYS_FILE)
    if not KEYS_FILE_RE.match(keys_file) or ".." in keys_file.split("/"):
        raise FleetFileError(_line(g, "keys_file"), f"keys_file {keys_file!r}: an absolute path")
    forwarded = str(_get(g, "ports", str, False, "")).strip()
    if forwarded:
        m = PORT_RANGE_RE.match(forwarded)
        if not m or not 1024 <= int(m[1]) <= int(m[2]) <= 65535:
            raise FleetFileError(
                _line(g, "ports"), f"gateway ports {forwarded!r}: <low>-<high> within 1024-65535"
            )
    return GatewaySpec(
        host, ports["port"], user, address, ports["ssh_port"], host_key, keys_file, forwarded
    )


_CLUSTER_KEYS = {
    "code", "name", "gpu_model", "fabric", "gpus_per_node", "nodes", "su_nodes", "scalable_units",
    "hostname", "address", "ssh_port", "host_keys", "numa_nodes", "gpus_per_hca", "rails",
    "runtime", "single_tenant",
}  # fmt: skip


def _cluster(
    c: _LDict,
    region: str,
    models: Mapping[str, GpuModelSpec],
    seen_clusters: set[str],
    seen_hosts: dict[str, int],
    seen_addresses: dict[str, int],
) -> ClusterSpec:
    code, model = _cluster_identity(c, models, seen_clusters)
    fabric, gpn, numa, per_hca, rails = _cluster_shape(c)
    link_gbps, leaf_ports = FABRICS[fabric]
    sizes = _su_sizes(c, fabric)
    sus = _cluster_nodes(c, code, region, sizes, seen_hosts, seen_addresses)
    runtime, single_tenant = _cluster_tenancy(c, code, sus)
    return ClusterSpec(
        code=code,
        name=_get(c, "name", str, False, code),
        region=region,
        gpu_model=model,
        fabric=fabric,
        gpus_per_node=gpn,
        sus=tuple(sus),
        numa_nodes=numa,
        gpus_per_hca=per_hca,
        rails=rails,
        link_gbps=link_gbps,
        leaf_ports=leaf_ports,
        line=c.line,
        runtime=runtime,
        single_tenant=single_tenant,
    )


def _cluster_tenancy(c: _LDict, code: str, sus: list[ScalableUnitSpec]) -> tuple[str, bool]:
    """The nodes' runtime and whether one tenant uses them at a time: ``runtime: process``
    isolates nothing, so it is refused unless the cluster says ``single_tenant: true``."""
    runtime = _get(c, "runtime", str, False, "")
    if runtime and runtime not in RUNTIMES:
        raise FleetFileError(
            _line(c, "runtime"), f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}"
        )
    single = _get(c, "single_tenant", bool, False, False)
    if runtime == "process" and not single:
        nodes = [n.hostname for su in sus for n in su.nodes]
        named = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        raise FleetFileError(
            _line(c, "runtime"),
            f"cluster {code} (node {named}): runtime process cannot isolate tenants that share a "
            "node; add single_tenant: true only for test hosts one tenant uses at a time, or use "
            "docker",
        )
    return runtime, single


def _cluster_identity(
    c: _LDict, models: Mapping[str, GpuModelSpec], seen_clusters: set[str]
) -> tuple[str, str]:
    """The cluster's code (new in the file) and its GPU model (declared in gpu_models)."""
    _no_unknown(c, _CLUSTER_KEYS, "a cluster")
    code = _get(c, "code", str)
    if not CODE_RE.match(code):
        raise FleetFileError(
            _line(c, "code"), f"cluster code {code!r}: lowercase letters, digits, '-'"
        )
    if code in seen_clusters:
        raise FleetFileError(_line(c, "code"), f"cluster {code} declared twice")
    seen_clusters.add(code)
    model = _get(c, "gpu_model", str)
    if model not in models:
        raise FleetFileError(
            _line(c, "gpu_model"), f"unknown GPU model {model!r}; declare it in gpu_models"
        )
    return code, model


def _cluster_shape(c: _LDict) -> tuple[str, int, int, int, int]:
    """Fabric, GPUs per node, NUMA nodes, GPUs per HCA and rails, each checked."""
    fabric = _get(c, "fabric", str)
    if fabric not in FABRICS:
        raise FleetFileError(
            _line(c, "fabric"), f"fabric {fabric!r} is not one of {', '.join(FABRICS)}"
        )
    gpn = _get(c, "gpus_per_node", int)
    if gpn not in (1, 2, 4, 8):
        raise FleetFileError(_line(c, "gpus_per_node"), "gpus_per_node must be 1, 2, 4 or 8")
    numa = _get(c, "numa_nodes", int, False, 2)
    per_hca = _get(c, "gpus_per_hca", int, False, 1 if fabric != FABRIC_ETHERNET else gpn)
    rails = _get(c, "rails", int, False, gpn if fabric != FABRIC_ETHERNET else 1)
    if numa not in (1, 2) or gpn % numa:
        raise FleetFileError(
            _line(c, "numa_nodes"), "numa_nodes must be 1 or 2 and divide the GPUs"
        )
    if per_hca < 1 or gpn % per_hca:
        raise FleetFileError(_line(c, "gpus_per_hca"), "gpus_per_hca must divide gpus_per_node")
    return fabric, gpn, numa, per_hca, rails


def _su_sizes(c: _LDict, fabric: str) -> list[int]:
    """Nodes per scalable unit (given as a list, or as nodes + su_nodes), checked against what a
    leaf and a two-level tree of the fabric hold."""
    leaf_ports = FABRICS[fabric][1]
    if "scalable_units" in c:
        if "su_nodes" in c or "nodes" in c:
            raise FleetFileError(
                _line(c, "scalable_units"),
                "give either scalable_units or nodes + su_nodes, not both",
            )
        sizes = _get(c, "scalable_units", list)
        for i, s in enumerate(sizes):
            if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
                raise FleetFileError(sizes.lines[i], f"SU size {s!r} must be a positive integer")
        sizes = list(sizes)
        size_line = _line(c, "scalable_units")
    else:
        nodes = _get(c, "nodes", int)
        su_nodes = _get(c, "su_nodes", int)
        if nodes <= 0 or su_nodes <= 0:
            raise FleetFileError(_line(c, "nodes"), "nodes and su_nodes must be positive")
        sizes = [su_nodes] * (nodes // su_nodes) + ([nodes % su_nodes] if nodes % su_nodes else [])
        size_line = _line(c, "su_nodes")
    if not sizes:
        raise FleetFileError(c.line, "a cluster needs at least one SU")
    if fabric != FABRIC_ETHERNET:
        # A non-blocking leaf gives half its ports to nodes: one rail-r HCA per node per leaf.
        most = leaf_ports // 2
        if max(sizes) > most:
            raise FleetFileError(
                size_line,
                f"an SU of {max(sizes)} nodes does not fit a non-blocking {fabric} leaf "
                f"({leaf_ports} ports: at most {most} nodes)",
            )
        spine_sus = leaf_ports  # two-level fat tree: a spine port per leaf
        if len(sizes) > spine_sus:
            raise FleetFileError(size_line, f"{len(sizes)} SUs exceed a two-level {fabric} tree")
    return sizes


def _cluster_nodes(
    c: _LDict,
    code: str,
    region: str,
    sizes: list[int],
    seen_hosts: dict[str, int],
    seen_addresses: dict[str, int],
) -> list[ScalableUnitSpec]:
    """The SUs' nodes named from the hostname and address templates (unique over the file), with
    their pinned host keys."""
    host_tpl = _get(c, "hostname", str)
    addr_tpl = _get(c, "address", str)
    port = _get(c, "ssh_port", int, False, 22)
    if not 0 < port < 65536:
        raise FleetFileError(_line(c, "ssh_port"), f"ssh_port {port} is out of range")
    keys = _get(c, "host_keys", dict, False, _LDict())
    sus: list[ScalableUnitSpec] = []
    hosts_here: set[str] = set()
    for si, size in enumerate(sizes, start=1):
        nodes_spec = []
        for ni in range(1, size + 1):
            try:
                hostname = host_tpl.format(su=si, node=ni, cluster=code, region=region)
                address = addr_tpl.format(su=si, node=ni, cluster=code, region=region)
            except (KeyError, IndexError, ValueError) as exc:
                raise FleetFileError(
                    _line(c, "hostname"), f"bad name template: {exc}; use {{su}} and {{node}}"
                ) from None
            if not HOSTNAME_RE.match(hostname):
                raise FleetFileError(_line(c, "hostname"), f"{hostname!r} is not a valid hostname")
            if hostname in seen_hosts:
                raise FleetFileError(
                    _line(c, "hostname"),
                    f"hostname {hostname} already used (line {seen_hosts[hostname]})",
                )
            if address in seen_addresses:
                raise FleetFileError(
                    _line(c, "address"),
                    f"address {address} already used (line {seen_addresses[address]})",
                )
            seen_hosts[hostname] = _line(c, "hostname")
            seen_addresses[address] = _line(c, "address")
            hosts_here.add(hostname)
            nodes_spec.append(NodeSpec(hostname, address, port, str(keys.get(hostname, ""))))
        sus.append(ScalableUnitSpec(si, f"su{si:02d}", tuple(nodes_spec)))
    for host in keys:
        if host not in hosts_here:
            raise FleetFileError(_line(keys, host), f"host key for unknown node {host!r}")
        if not str(keys[host]).startswith("SHA256:"):
            raise FleetFileError(
                _line(keys, host), "host keys are pinned as SHA256:<base64> fingerprints"
            )
    return sus
