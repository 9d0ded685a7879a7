"""The SSH driver's steps (isolate, connect, prepare, mount, start, health, the all-reduce check,
the workload's output, teardown), each one or two fixed commands on one node's connection."""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from slices.drivers.base import (
    DriverError,
    GatewayGrant,
    GatewayTarget,
    InstanceSpec,
    LogFn,
    NodeTarget,
    StepResult,
    Tunnel,
    WorkloadOutput,
)
from slices.drivers.slurm import OutputChunk, RestAnswer, SlurmSetup
from slices.drivers.ssh import edge, slurm, tunnel
from slices.drivers.ssh.client import SshConnections, SshSettings, fingerprint
from slices.drivers.ssh.commands import (
    ASSET_PREFIX,
    CMD_ALLREDUCE,
    CMD_DOCKER_HEALTH,
    CMD_DOCKER_HEALTH_NO_GPU,
    CMD_ID,
    CMD_IN_INSTANCE,
    CMD_LINK,
    CMD_MOUNT_CHECK,
    CMD_PAUSE_DOCKER,
    CMD_PORT_OWNER,
    CMD_PORT_OWNER_DOCKER_HOST,
    CMD_PORT_OWNER_DOCKER_PUBLISHED,
    CMD_PROCESS_HEALTH,
    CMD_READ_DOCKER_OUTPUT,
    CMD_READ_OUTPUT,
    CMD_REMOVE,
    CMD_START_DOCKER,
    CMD_START_DOCKER_SSHD,
    CMD_START_ENROOT,
    CMD_START_INSTANCE_SSHD,
    CMD_START_PROCESS,
    CMD_STOP_DOCKER,
    CMD_STOP_ENROOT,
    CMD_STOP_INSTANCE_SSHD,
    CMD_STOP_PROCESS,
    CMD_TAR_IN,
    CMD_TAR_OUT,
    CMD_TOOLS,
    CMD_UPTIME,
    CONFIG_LABEL,
    DISK_IMAGE,
    DOCKER_SSHD_SCRIPT,
    ENV,
    IMAGE_REF,
    INSTANCE_SSHD_CONFIG,
    MOUNT_ROOTS,
    NO_GPU_DRIVER,
    NSENTER,
    OWNER,
    RUNTIMES,
    SAFE_RELATIVE,
    SETSID,
    SH,
    SLEEP,
    SLUG,
    SSH_KEYGEN,
    SSHD,
    TAIL_BYTES,
    UNSHARE,
    XARGS,
    Arg,
    argument_file,
    clean_abs,
    clean_env,
    env_file,
    render,
)
from slices.drivers.ssh.gateway import sync_gateway_keys
from slices.drivers.ssh.shell import SshShell, open_ssh_shell
from slices.slurmconf import SlurmPaths

# Rough expectations per step on one node (for the ETA); a docker start includes the image pull.
STEP_SECONDS: dict[str, float] = {
    "isolate": 0.1,
    "connect": 1.0,
    "prepare": 1.0,
    "mount": 1.0,
    "start": 30.0,
    "health": 2.0,
    "allreduce": 60.0,
    "teardown": 5.0,
}
# What the all-reduce check exports to its ranks (the console's values, never the instance's).
ALLREDUCE_ENV = ("MASTER_ADDR", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_PKEY")
_LABEL_FMT = '{{index .Config.Labels "' + CONFIG_LABEL + '"}}'


@dataclass(frozen=True)
class _Paths:
    """Where an instance's files are on a node (see the package's docstring)."""

    root: str  # <workdir>/instances/<slug>
    env: str
    launch: str
    hostfile: str
    authorized_keys: str
    pid: str
    log: str
    pfs: str
    squashfs: str

    @classmethod
    def under(cls, root: str) -> _Paths:
        return cls(
            root=root,
            env=f"{root}/environment",
            launch=f"{root}/launch.args",
            hostfile=f"{root}/hostfile",
            authorized_keys=f"{root}/authorized_keys",
            pid=f"{root}/pid",
            log=f"{root}/output.log",
            pfs=f"{root}/pfs",
            squashfs=f"{root}/image.sqsh",
        )

    def inside(self, target: str) -> str:
        return f"{self.root}/{target.lstrip('/')}"


class SshDriver(SshConnections):
    name = "ssh"
    simulated = False

    @classmethod
    def from_settings(cls, settings: Any) -> SshDriver:
        """The driver as ``slices.drivers.registry`` makes it."""
        return cls(SshSettings.from_settings(settings))

    def step_seconds(self) -> dict[str, float]:
        return dict(STEP_SECONDS)

    # -- what a step needs ------------------------------------------------------------------
    def _paths(self, spec: InstanceSpec, node: NodeTarget) -> _Paths:
        if not SLUG.fullmatch(spec.slug):
            raise DriverError("bad_identifier", f"instance slug {spec.slug!r}", permanent=True)
        workdir = clean_abs(node.workdir, "the node's workdir")
        return _Paths.under(f"{workdir}/instances/{spec.slug}")

    def _runtime(self, node: NodeTarget) -> str:
        if node.runtime not in RUNTIMES:
            raise DriverError(
                "bad_identifier",
                f"{node.hostname}: unknown container runtime {node.runtime!r}",
                permanent=True,
            )
        return node.runtime

    def _isolating_runtime(self, node: NodeTarget) -> str:
        """The node's runtime, refused where it cannot keep this instance apart from the others
        a node may hold: a bare process isolates nothing, and enroot gives no network namespace
        of its own; both run only on a node the instance holds whole, or on a host marked
        single-tenant (the test hosts). Docker isolates any share of a node."""
        runtime = self._runtime(node)
        if runtime != "docker" and not node.exclusive and not node.single_tenant:
            raise DriverError(
                "runtime_not_isolating",
                f"{node.hostname} runs {runtime}, which cannot isolate tenants that share a node; "
                f"it runs an instance holding the whole node only ({len(node.gpus)} of "
                f"{node.node_gpus or '?'} GPUs here), unless the node is marked single_tenant "
                "(a test host)",
                permanent=True,
            )
        return runtime

    def _pfs_source(self, spec: InstanceSpec) -> str:
        if not OWNER.fullmatch(spec.owner):
            raise DriverError("bad_identifier", f"owner id {spec.owner!r}", permanent=True)
        return f"{clean_abs(self.settings.pfs_root, 'SLICES_PFS_ROOT')}/{spec.owner}"

    def _asset_mounts(self, spec: InstanceSpec) -> list[tuple[str, str]]:
        """(source on the node, target in the instance) for each marketplace asset."""
        root = clean_abs(self.settings.asset_root, "SLICES_ASSET_ROOT")
        pairs = []
        for mount in spec.mounts:
            rel = mount.source
            if rel.startswith(ASSET_PREFIX):
                rel = rel[len(ASSET_PREFIX) :]
            rel = rel.lstrip("/")
            norm = posixpath.normpath(rel) if rel else ""
            if not SAFE_RELATIVE.fullmatch(norm) or ".." in rel.split("/"):
                raise DriverError("bad_identifier", f"asset path {mount.source!r}", permanent=True)
            target = clean_abs(mount.target, "mount target")
            if not target.startswith(MOUNT_ROOTS) or target.count("/") < 2:
                raise DriverError(
                    "bad_identifier",
                    f"mount target {target!r}: assets are mounted under "
                    f"{', '.join(MOUNT_ROOTS)} only",
                    permanent=True,
                )
            pairs.append((f"{root}/{norm}", target))
        return pairs

    def _binary(self, path: str, setting: str) -> str:
        return clean_abs(path, setting)

    def _node_env(self, spec: InstanceSpec, node: NodeTarget, paths: _Paths) -> dict[str, str]:
        """The instance's environment on ``node``: the job's (console values over the
        instance's), checked (``clean_env``), then the devices from the allocation, which no one
        else sets: a tenant's CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES is overwritten."""
        env = clean_env(spec.job_env(node))
        host = ",".join(str(g) for g in node.gpus)
        if node.runtime == "docker":
            # The container sees only its devices (``--gpus``), numbered from 0; none at all in
            # 无卡模式 ("void": the NVIDIA runtime hook mounts nothing, even by default).
            env["NVIDIA_VISIBLE_DEVICES"] = host or "void"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(node.gpus)))
        else:
            # No container hides the node's other GPUs: point CUDA (and enroot's hook) at ours.
            env["NVIDIA_VISIBLE_DEVICES"] = host or "void"
            env["CUDA_VISIBLE_DEVICES"] = host
        # Where the image's web apps listen (the launch template's --ip): all of the container's
        # own interfaces behind docker's bridge (published on the node's loopback), else the
        # node's loopback only, reached through the console's tunnel (issue 19).
        bridged = node.runtime == "docker" and not node.exclusive
        if spec.slurm_run:
            env["SLURM_CONF"] = f"{spec.slurm_run}/slurm.conf"  # sbatch, srun, sinfo (issue 31)
        env["GPC_BIND_ADDRESS"] = "0.0.0.0" if bridged else "127.0.0.1"  # noqa: S104
        if node.runtime == "process":
            # A bare process has no image to give it a PATH: the operator's, and its own home.
            env["PATH"] = self.settings.node_path
            env.setdefault("HOME", paths.root)
            # No image, no /workspace: the launch template's apps work in the instance's directory.
            env["GPC_WORKSPACE"] = paths.root
        return env

    def _where(self, node: NodeTarget) -> str:
        return f"{self.settings.user}@{node.address}:{node.port}"

    # -- steps -----------------------------------------------------------------------------
    def isolate(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        if spec.partition_key is None:
            log("single host: no fabric partition needed")
        else:
            log(
                f"no fabric manager (UFM) is configured for the ssh driver: partition key "
                f"{spec.partition_key:#06x} is recorded by the console and set as NCCL_IB_PKEY on "
                f"the {len(spec.nodes)} node(s), not enforced on the switches"
            )
        return StepResult({"partition_key": spec.partition_key, "enforced": False})

    def connect(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        with self.session(node) as client:
            transport = client.get_transport()
            key = transport.get_remote_server_key() if transport is not None else None
            result = self.run(client, node, CMD_ID, timeout=self.settings.connect_timeout, log=None)
        uid = result.stdout.strip()
        log(
            f"ssh {self._where(node)}: host key {fingerprint(key) if key else '?'} matches the "
            f"pinned key; logged in (uid {uid})"
        )
        return StepResult({"uid": uid})

    def probe(self, node: NodeTarget) -> StepResult:
        """The node's heartbeat: its uptime, read over the pinned connection (a kept one when it
        is alive, else a new one whose host key is checked again), within the connect timeout."""
        timeout = self.settings.connect_timeout
        with self.session(node) as client:
            result = self.run(client, node, CMD_UPTIME, timeout=timeout, log=None)
        fields = result.stdout.split()
        try:
            uptime = float(fields[0]) if fields else None
        except ValueError:
            uptime = None
        return StepResult({"uptime_s": uptime})

    def prepare(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        self._isolating_runtime(node)
        env = self._node_env(spec, node, paths)
        with self.session(node) as client:
            self.write_files(
                client,
                paths.root,
                [
                    (paths.authorized_keys, _authorized_keys(spec), 0o600),
                    (paths.hostfile, spec.hostfile(), 0o644),
                    (paths.env, env_file(env), 0o600),
                ],
            )
        log(f"created {paths.root}")
        log(
            f"wrote the hostfile ({len(spec.nodes)} node(s)) and the environment "
            f"(NODE_RANK={node.rank}, MASTER_ADDR={spec.master_addr}, {len(env)} variables)"
        )
        return StepResult({"dir": paths.root})

    def mount(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        pfs = self._pfs_source(spec)
        assets = self._asset_mounts(spec)
        pairs: list[str] = [pfs, paths.pfs]
        for src, target in assets:
            pairs += [src, paths.inside(target)]
        with self.session(node) as client:
            result = self.run(
                client,
                node,
                # On runtime=process the links are made in the same command; a container runtime
                # bind-mounts the same sources when it starts.
                CMD_MOUNT_CHECK + (" && " + CMD_LINK if runtime == "process" else ""),
                pfs=pfs,
                sources=[src for src, _ in assets],
                pairs=pairs,
                log=log,
                check=False,
            )
            if result.exit_status == 3:
                raise DriverError(
                    "asset_missing",
                    f"{node.hostname}: {result.stderr.strip()[-300:]} is not on the parallel "
                    "file system",
                    permanent=True,
                )
            if result.exit_status != 0:
                raise DriverError(
                    "command_failed", f"{node.hostname}: {result.stderr.strip()[-300:]}"
                )
        where = "linked" if runtime == "process" else "bind-mounted when the container starts"
        log(f"parallel file system {pfs} {where} at /pfs")
        for src, target in assets:
            log(f"{src} {where} read-only at {target}")
        return StepResult({"mounts": len(assets) + 1})

    def start(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        runtime = self._isolating_runtime(node)
        if spec.image and not IMAGE_REF.fullmatch(spec.image):
            raise DriverError("bad_identifier", f"image {spec.image!r}", permanent=True)
        if runtime != "process" and not spec.image:
            raise DriverError(
                "no_image", f"{node.hostname} runs {runtime}: an image is needed", permanent=True
            )
        # The entrypoint is catalogue data (the image's launch template), never user input; it is
        # run by a shell inside the instance so that its ${VARIABLES} expand from the instance's
        # environment. The host's shell never sees it: it is an argument (docker) or an item of
        # the argument file (process, enroot).
        command = [SH, "-c", spec.entrypoint] if spec.entrypoint else []
        env = self._node_env(spec, node, paths)
        with self.session(node) as client:
            if runtime == "docker":
                template = CMD_START_DOCKER
                args = self._docker_args(spec, node, paths, env, command)
            else:
                launcher: Arg
                if runtime == "enroot":
                    launcher = self._binary(self.settings.enroot_bin, "SLICES_ENROOT_BIN")
                    argv = self._enroot_argv(spec, env, command)
                    template = CMD_START_ENROOT
                else:
                    launcher = [ENV, "-i"]  # nothing of the node's environment, only the file's
                    argv = [f"{k}={v}" for k, v in env.items()] + (command or [SLEEP, "infinity"])
                    template = CMD_START_PROCESS
                body, count, size = argument_file(argv)
                # Over SFTP, no shell: what the launcher runs is exactly these items.
                self.write_files(client, paths.root, [(paths.launch, body, 0o600)])
                args = self._launch_args(spec, paths, launcher, count, size)
            # Only docker's output (the image pull, the ports) is worth logging.
            result = self.run_script(
                client, node, render(template, **args), log=log if runtime == "docker" else None
            )
            sshd = self._start_sshd(client, spec, node, paths, runtime, log)
        reused = "reused" in result.stdout
        what = {"process": "process", "docker": "container", "enroot": "enroot container"}[runtime]
        log(
            f"{what} {spec.slug} already running: reused"
            if reused
            else f"started {what} {spec.slug} ({spec.image or 'bare host'}) with "
            f"{len(node.gpus)} GPU(s), {self._network(node, runtime)}"
        )
        data: dict[str, object] = {"reused": reused, **sshd}
        ports = re.findall(r"^(\d+)/tcp -> \S+:(\d+)$", result.stdout, re.MULTILINE)
        if ports:
            data["ports"] = {int(inner): int(outer) for inner, outer in ports}
        return StepResult(data)

    @staticmethod
    def _network(node: NodeTarget, runtime: str) -> str:
        if runtime == "docker" and not node.exclusive:
            return "its own network namespace and IPC"
        return "the host's network and IPC" if node.exclusive else "a single-tenant test host"

    def _launch_args(
        self, spec: InstanceSpec, paths: _Paths, launcher: Arg, count: int, size: int
    ) -> dict[str, Arg]:
        args: dict[str, Arg] = {
            "pid": paths.pid,
            "root": paths.root,
            "output": paths.log,
            "setsid": SETSID,
            "unshare": UNSHARE,
            "xargs": XARGS,
            "args": paths.launch,
            "count": count,
            "size": size,
            "launcher": launcher,
        }
        if isinstance(launcher, str):  # enroot
            args.update(
                enroot=launcher,
                squashfs=paths.squashfs,
                image_uri=f"docker://{spec.image}",
                name=spec.slug,
            )
        return args

    def _docker_args(
        self,
        spec: InstanceSpec,
        node: NodeTarget,
        paths: _Paths,
        env: dict[str, str],
        command: list[str],
    ) -> dict[str, Arg]:
        volumes = ["-v", f"{self._pfs_source(spec)}:/pfs"]
        volumes += ["-v", f"{paths.authorized_keys}:/root/.ssh/authorized_keys:ro"]
        volumes += ["-v", f"{paths.hostfile}:/etc/gpc/hostfile:ro"]
        for src, target in self._asset_mounts(spec):
            volumes += ["-v", f"{src}:{target}:ro"]
        # Exactly the allocation's devices, listed even for a whole node (never "all"); none at
        # all in 无卡模式 (no --gpus: the container gets no GPU device).
        devices = ["--gpus", '"device=' + ",".join(str(g) for g in node.gpus) + '"']
        devices = devices if node.gpus else []
        if node.exclusive:
            # The whole node (or a node of a slice): host networking for NCCL over InfiniBand.
            network, publish, ib = ["--network", "host", "--ipc", "host"], [], "1"
        else:
            # Sharing the node: a network namespace and IPC of its own; the image's ports are
            # published on free host ports (docker picks them), so two instances never collide.
            network, ib = ["--network", "bridge", "--ipc", "private"], "0"
            # On the node's loopback only: the console reaches them through its SSH tunnel,
            # nothing is published on the node's public interfaces (issue 19).
            publish = [a for p in spec.ports for a in ("-p", f"127.0.0.1::{int(p)}")]
            if node.instance_ssh_port:
                # The instance's sshd (22 in its namespace) on its port of the node's address,
                # which the region's gateway forwards to.
                publish += ["-p", f"{_listen(node)}:{int(node.instance_ssh_port)}:22"]
        args: dict[str, Arg] = {
            "docker": self._binary(self.settings.docker_bin, "SLICES_DOCKER_BIN"),
            "name": spec.slug,
            "label_fmt": _LABEL_FMT,
            "disk": DISK_IMAGE.format(slug=spec.slug),
            "devices": devices,
            "network": network,
            "ib": ib,
            "env_file": paths.env,
            "publish": publish,
            "volumes": volumes,
            "image": spec.image,
            "command": command,
        }
        # What the container was created with: a stopped one is reused only if it matches.
        config = json.dumps(
            [
                args[k]
                for k in ("devices", "network", "ib", "publish", "volumes", "image", "command")
            ]
            + [env_file(env)],
        )
        digest = hashlib.sha256(config.encode()).hexdigest()[:32]
        args["config"] = digest
        args["label"] = f"{CONFIG_LABEL}={digest}"
        return args

    def _enroot_argv(
        self, spec: InstanceSpec, env: dict[str, str], command: list[str]
    ) -> list[str]:
        """``enroot start``'s arguments: the mounts (colon-separated fstab lines) and every
        variable as ``--env=NAME=value`` (enroot writes them to the container's environment file;
        its own environment is the host's, so nothing of the tenant's steers enroot's bash)."""
        argv = ["start", "--rw", f"--mount={self._pfs_source(spec)}:/pfs:none:x-create=dir,bind"]
        for src, target in self._asset_mounts(spec):
            argv.append(f"--mount={src}:{target}:none:x-create=dir,bind,ro")
        argv += [f"--env={k}={v}" for k, v in env.items()]
        return [*argv, "--", spec.slug, *(command or [SLEEP, "infinity"])]

    def health(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        # The last provisioning step on a node: its connection is not kept, except the first
        # node's of a slice, which the all-reduce check uses next.
        first_of_slice = len(spec.nodes) > 1 and node == spec.nodes[0]
        args: dict[str, Arg]
        if runtime == "docker":
            template = CMD_DOCKER_HEALTH if node.gpus else CMD_DOCKER_HEALTH_NO_GPU
            args = {
                "docker": self._binary(self.settings.docker_bin, "SLICES_DOCKER_BIN"),
                "fmt": "{{.State.Running}}",
                "name": spec.slug,
            }
        else:
            template = CMD_PROCESS_HEALTH
            args = {"pid": paths.pid, "output": paths.log, "none": "__no_nvidia_smi__"}
        gpus = self.run_on(node, template, args, last=not first_of_slice, check=False)
        if gpus.exit_status == 5:
            raise DriverError(
                "not_running",
                f"{node.hostname}: the instance's {'container' if runtime == 'docker' else 'process'}"
                f" is not running: {gpus.stderr.strip()[-400:]}",
                permanent=True,
            )
        listed = [ln for ln in gpus.stdout.splitlines() if ln.startswith("GPU ")]
        if runtime == "docker" and not node.gpus:
            if listed:
                raise DriverError(
                    "gpu_leak",
                    f"{node.hostname}: a GPU-less container sees {len(listed)} GPU(s)",
                    permanent=True,
                )
            log(f"{spec.slug} running without GPUs: nvidia-smi lists none in the container")
            return StepResult({"gpus_visible": 0})
        if "__no_nvidia_smi__" in gpus.stdout:
            if runtime != "process":
                raise DriverError(
                    "gpu_missing", f"{node.hostname}: nvidia-smi is not installed", permanent=True
                )
            log(NO_GPU_DRIVER)
            log(f"{spec.slug}: process alive")
            return StepResult({"gpus_visible": None, "gpu_check": "skipped"})
        indexes = {int(m.group(1)) for ln in listed if (m := re.match(r"GPU (\d+):", ln))}
        if runtime == "docker":
            ok = gpus.exit_status == 0 and len(listed) == len(node.gpus)
        else:
            ok = gpus.exit_status == 0 and set(node.gpus) <= indexes
        if not ok:
            raise DriverError(
                "gpu_missing",
                f"{node.hostname}: nvidia-smi lists {len(listed)} GPU(s); the instance has "
                f"{len(node.gpus)} ({gpus.stderr.strip()[-200:]})",
                permanent=True,
            )
        log(f"nvidia-smi: {len(node.gpus)} GPU(s) visible; {spec.slug} running")
        return StepResult({"gpus_visible": len(node.gpus)})

    def allreduce_check(self, spec: InstanceSpec, log: LogFn) -> StepResult:
        if not spec.nodes:
            return StepResult({"measured": False, "why": "no nodes"})
        first = spec.nodes[0]
        paths = self._paths(spec, first)
        mpirun = self._binary(self.settings.mpirun_bin, "SLICES_MPIRUN_BIN")
        with self.session(first, last=True) as client:
            found = self.run(
                client, first, CMD_TOOLS, tools=["all_reduce_perf", "nvidia-smi"], mpirun=mpirun
            ).stdout
            tools = dict(line.split(" ", 1) for line in found.splitlines() if " " in line)
            why = ""
            if "all_reduce_perf" not in tools:
                why = (
                    "no GPUs on the test hosts"
                    if "nvidia-smi" not in tools
                    else f"nccl-tests' all_reduce_perf is not installed on {first.hostname}"
                )
            elif "mpirun" not in tools:
                why = f"mpirun is not installed at {mpirun} on {first.hostname}"
            if why:
                log(f"all-reduce check not run: {why}")
                return StepResult({"measured": False, "why": why})
            job = spec.job_env(first)
            exports: list[str] = []
            for name in ALLREDUCE_ENV:
                if name in job:
                    exports += ["-x", f"{name}={job[name]}"]
            result = self.run(
                client,
                first,
                CMD_ALLREDUCE,
                log=log,
                mpirun=mpirun,
                hostfile=paths.hostfile,
                ranks=sum(len(n.gpus) for n in spec.nodes),
                exports=exports,
                allreduce=clean_abs(tools["all_reduce_perf"], "all_reduce_perf"),
                check=False,
            )
        figures = parse_all_reduce_perf(result.stdout)
        if result.exit_status != 0 or figures is None:
            why = f"all_reduce_perf failed (exit {result.exit_status})"
            log(why)
            return StepResult({"measured": False, "why": why})
        log(
            f"all_reduce_perf over {len(spec.nodes)} nodes: bus bandwidth "
            f"{figures['busbw_gbps']:.1f} GB/s, 8-byte latency {figures['latency_us']:.1f} µs"
        )
        return StepResult({"measured": True, **figures})

    def workload_output(
        self, spec: InstanceSpec, node: NodeTarget, offset: int, elapsed_s: float, limit: int
    ) -> WorkloadOutput:
        """Complete lines the instance's workload printed on ``node`` from line ``offset`` (0 =
        the first), at most ``limit``, and whether it still runs. ``elapsed_s`` is unused here."""
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        cap = TAIL_BYTES // 2
        args: dict[str, Arg] = {"start": offset + 1, "lines": max(1, limit), "bytes": cap}
        if runtime == "docker":
            template = CMD_READ_DOCKER_OUTPUT
            args.update(
                docker=self._binary(self.settings.docker_bin, "SLICES_DOCKER_BIN"),
                name=spec.slug,
                fmt="{{.State.Running}}",
            )
        else:
            template = CMD_READ_OUTPUT
            args.update(output=paths.log, pid=paths.pid)
        result = self.run_on(node, template, args, check=False)
        running = "__exited__" not in result.stderr
        text = result.stdout
        parts = text.split("\n")
        if text.endswith("\n"):
            lines = parts[:-1]
        elif not running:
            lines = parts if text else []  # the workload ended: its last line is complete
        elif len(parts) > 1:
            lines = parts[:-1]  # the last line is still being written: read it next time
        elif len(text.encode()) >= cap:
            lines = [text]  # one line longer than a read: take it as it is
        else:
            lines = []
        return WorkloadOutput(lines[:limit], running)

    def teardown(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        links = [paths.pfs] + [paths.inside(t) for _src, t in self._asset_mounts(spec)]
        with self.session(node, last=True) as client:
            if runtime == "docker":
                docker = self._binary(self.settings.docker_bin, "SLICES_DOCKER_BIN")
                disk = DISK_IMAGE.format(slug=spec.slug)
                self.run(client, node, CMD_STOP_DOCKER, docker=docker, name=spec.slug, disk=disk)
            elif runtime == "enroot":
                enroot = self._binary(self.settings.enroot_bin, "SLICES_ENROOT_BIN")
                self.run(
                    client, node, CMD_STOP_ENROOT, pid=paths.pid, enroot=enroot, name=spec.slug
                )
            else:
                self.run(client, node, CMD_STOP_INSTANCE_SSHD, log=log, **_sshd_files(paths))
                self.run(client, node, CMD_STOP_PROCESS, pid=paths.pid, log=log)
            self.run(client, node, CMD_REMOVE, links=links, root=paths.root, log=log)
            if spec.slurm_run:  # the slice's Slurm keys and config (its daemons ended above)
                slurm.remove(self, client, node, clean_abs(spec.slurm_run, "the Slurm directory"))
        log(f"stopped {spec.slug} and removed {paths.root}")
        return StepResult()

    def stop(self, spec: InstanceSpec, node: NodeTarget, log: LogFn) -> StepResult:
        """关机: stop what runs for the instance; keep its directory (the system disk), its links
        and a docker container's writable layer, for the next start on this node."""
        paths = self._paths(spec, node)
        runtime = self._runtime(node)
        if runtime == "docker":
            docker = self._binary(self.settings.docker_bin, "SLICES_DOCKER_BIN")
            self.run_on(
                node, CMD_PAUSE_DOCKER, {"docker": docker, "name": spec.slug}, last=True, log=log
            )
        else:
            with self.session(node, last=True) as client:
                self.run(client, node, CMD_STOP_INSTANCE_SSHD, log=log, **_sshd_files(paths))
                self.run(client, node, CMD_STOP_PROCESS, pid=paths.pid, log=log)
        log(f"stopped {spec.slug}; kept {paths.root}")
        return StepResult()

    def move_disk(
        self, spec: InstanceSpec, src: NodeTarget, dst: NodeTarget, log: LogFn
    ) -> StepResult:
        """Copy the instance's directory (its system disk) from ``src`` to ``dst``: a tar stream
        out of one SSH channel into the other, through the console (nodes need no keys)."""
        out_cmd = self.host_command(render(CMD_TAR_OUT, root=self._paths(spec, src).root))
        in_cmd = self.host_command(render(CMD_TAR_IN, root=self._paths(spec, dst).root))
        total = 0
        with self.session(src, last=True) as a, self.session(dst) as b:
            ta, tb = a.get_transport(), b.get_transport()
            if ta is None or tb is None:
                raise DriverError("unreachable", f"{src.hostname} or {dst.hostname} disconnected")
            reader, writer = ta.open_session(), tb.open_session()
            reader.settimeout(self.settings.command_timeout)
            writer.settimeout(self.settings.command_timeout)
            reader.exec_command(out_cmd)
            writer.exec_command(in_cmd)
            while data := reader.recv(1 << 16):
                writer.sendall(data)
                total += len(data)
            writer.shutdown_write()
            status_out, status_in = reader.recv_exit_status(), writer.recv_exit_status()
            errors = (reader.recv_stderr(2000) + writer.recv_stderr(2000)).decode(errors="replace")
        if status_out or status_in:
            raise DriverError(
                "disk_move_failed",
                f"{src.hostname} → {dst.hostname}: tar exited {status_out}/{status_in} "
                f"{errors.strip()[-300:]}",
            )
        log(
            f"copied the system disk of {spec.slug} ({total} bytes) from {src.hostname} to "
            f"{dst.hostname}"
        )
        return StepResult({"bytes": total})

    # -- the web terminal (issue 19) -----------------------------------------------------------
    def open_shell(
        self, spec: InstanceSpec, node: NodeTarget, cols: int, rows: int, *, gpu_model: str = ""
    ) -> SshShell:
        """A login shell in the instance with a PTY (``slices.drivers.ssh.shell``)."""
        return open_ssh_shell(self, spec, node, cols, rows)

    # -- web ports (issue 19) ----------------------------------------------------------------
    def open_tunnel(self, spec: InstanceSpec, node: NodeTarget, port: int) -> Tunnel:
        """A ``direct-tcpip`` channel to ``127.0.0.1:<port>`` on ``node`` (the caller passes
        the published host port on a shared node) over the process's shared, pinned
        connection to it (``slices.drivers.ssh.tunnel``), kept once the node says the port is
        the instance's own (``tunnel.open_owned_channel`` running ``CMD_PORT_OWNER*``): never
        another tenant's process, nor a service of the node (the console itself on a test
        host). ``port_not_instance`` otherwise, ``port_closed`` when nothing listens there."""
        return tunnel.open_owned_channel(self, node, port, self._port_owner(spec, node, port))

    def edge_socket(self, spec: InstanceSpec, node: NodeTarget, port: int, folder: str) -> str:
        """The production edge's way to the port (issue 34): a unix socket under ``folder``
        that an OpenSSH master forwards to ``127.0.0.1:<port>`` on ``node``
        (``slices.drivers.ssh.edge``), after the same ownership check as ``open_tunnel``;
        nginx moves the bytes."""
        owner = self._port_owner(spec, node, port)
        return str(edge.forward(self, node, port, owner, Path(folder)))

    def _port_owner(self, spec: InstanceSpec, node: NodeTarget, port: int) -> tuple[str, str]:
        """The instance's slug and the rendered check that ``port`` on ``node`` is its own."""
        runtime = self._runtime(node)
        paths = self._paths(spec, node)
        args: dict[str, Arg]
        if runtime == "docker":
            args = {
                "docker": self._binary(self.settings.docker_bin, "SLICES_DOCKER_BIN"),
                "name": spec.slug,
            }
            if node.exclusive:
                template = CMD_PORT_OWNER_DOCKER_HOST
                args["fmt"] = "{{.State.Pid}}"
            else:
                template = CMD_PORT_OWNER_DOCKER_PUBLISHED
                args["address"] = f"127.0.0.1:{int(port)}"
        else:
            template = CMD_PORT_OWNER
            args = {"pid": paths.pid}
        args.update(port=int(port), hexport=f"{int(port):04X}")
        return (spec.slug, render(template, **args))

    # -- the slice's Slurm (issue 31: slices.drivers.ssh.slurm) ---------------------------------
    def start_slurm(self, spec: InstanceSpec, setup: SlurmSetup, log: LogFn) -> StepResult:
        return slurm.start_slurm(self, spec, setup, log)

    def slurm_request(
        self,
        spec: InstanceSpec,
        setup: SlurmSetup,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        token: str,
    ) -> RestAnswer:
        return slurm.request(self, spec, setup, method, path, body, token)

    def slurm_output(
        self, spec: InstanceSpec, setup: SlurmSetup, job_id: int, offset: int, limit: int
    ) -> OutputChunk:
        return slurm.output(self, spec, setup, job_id, offset, limit)

    def slurm_paths(self, spec: InstanceSpec, setup: SlurmSetup) -> SlurmPaths:
        return slurm.paths(self, spec, setup)

    # -- SSH through the region's gateway (issue 19) -------------------------------------------
    def _start_sshd(
        self,
        client: paramiko.SSHClient,
        spec: InstanceSpec,
        node: NodeTarget,
        paths: _Paths,
        runtime: str,
        log: LogFn,
    ) -> dict[str, object]:
        """The instance's own sshd on its port of the node (``node.instance_ssh_port``): a
        daemon of its own for a bare process, the image's sshd in a docker container (on that
        port of the host's network on a whole node; on 22 in its own namespace, published on
        that port, on a shared one). enroot gives none yet. No port, no sshd."""
        port = int(node.instance_ssh_port or 0)
        if not port:
            return {}
        if not 0 < port < 65536:
            raise DriverError("bad_identifier", f"instance SSH port {port!r}", permanent=True)
        where = f"{node.address}:{port}"
        if runtime == "process":
            files = _sshd_files(paths)
            config = INSTANCE_SSHD_CONFIG.format(port=port, address=_listen(node), root=paths.root)
            if spec.slurm_run:  # sbatch, srun, sinfo over SSH too (issue 31)
                conf = clean_abs(f"{spec.slurm_run}/slurm.conf", "the Slurm config")
                config += f"SetEnv SLURM_CONF={conf}\n"
            written: list[tuple[str, str | bytes, int]] = [(files["config"], config, 0o600)]
            if spec.ssh_host_key:
                # The console's key for the instance: the same on every node (issue 29).
                written += _host_key_files(files["hostkey"], spec.ssh_host_key)
            self.write_files(client, paths.root, written)
            # Inside the instance's namespaces (the process rule): the sshd, and every session it
            # accepts, end with the instance.
            script = render(
                CMD_START_INSTANCE_SSHD, keygen=SSH_KEYGEN, sshd=SSHD, slug=spec.slug, **files
            )
            result = self.run(
                client,
                node,
                CMD_IN_INSTANCE,
                check=False,
                pid=paths.pid,
                nsenter=NSENTER,
                root=paths.root,
                sh=SH,
                script=script,
            )
            if result.exit_status != 0:
                raise DriverError(
                    "command_failed",
                    f"{node.hostname}: the instance's sshd did not start: "
                    f"{result.stderr.strip()[-300:]}",
                )
        elif runtime == "docker":
            docker = self._binary(self.settings.docker_bin, "SLICES_DOCKER_BIN")
            sshd_args = [
                "-o",
                "PasswordAuthentication=no",
                "-o",
                "PermitRootLogin=prohibit-password",
            ]
            if node.exclusive:
                sshd_args += ["-p", str(port), "-o", f"ListenAddress={_listen(node)}"]
            else:
                sshd_args += ["-p", "22"]
            result = self.run(
                client,
                node,
                CMD_START_DOCKER_SSHD,
                check=False,
                docker=docker,
                name=spec.slug,
                script=DOCKER_SSHD_SCRIPT,
                sshd_args=sshd_args,
            )
            if result.exit_status == 7:
                log(f"{spec.slug}: the image has no sshd; no SSH endpoint on {node.hostname}")
                return {"sshd": False}
            if result.exit_status != 0:
                raise DriverError(
                    "command_failed",
                    f"{node.hostname}: the instance's sshd did not start: "
                    f"{result.stderr.strip()[-300:]}",
                )
        else:
            log(f"{spec.slug}: no per-instance sshd on {runtime} yet; no SSH endpoint")
            return {"sshd": False}
        reused = "sshd reused" in result.stdout
        log(f"the instance's sshd {'is already listening' if reused else 'listens'} on {where}")
        return {"sshd": True, "ssh_port": port}

    def sync_gateway(
        self, gateway: GatewayTarget, grants: tuple[GatewayGrant, ...], log: LogFn
    ) -> StepResult:
        """Replace the region gateway's keys file with ``grants`` (``ssh.gateway``)."""
        return sync_gateway_keys(self, gateway, grants, log)


def _listen(node: NodeTarget) -> str:
    """The node address the instance's sshd listens on (the one the gateway forwards to)."""
    if not re.fullmatch(r"[A-Za-z0-9.:-]{1,253}", node.address):
        raise DriverError("bad_identifier", f"node address {node.address!r}", permanent=True)
    return node.address


def _host_key_files(path: str, private: str) -> list[tuple[str, str | bytes, int]]:
    """The host key and its ``.pub`` from the console's OpenSSH private key text (refused when
    it is not one ed25519 key: nothing else is written as a host key)."""
    try:
        key = paramiko.Ed25519Key.from_private_key(io.StringIO(private))
    except (paramiko.SSHException, ValueError):
        raise DriverError("bad_identifier", "the instance's host key", permanent=True) from None
    public = f"{key.get_name()} {key.get_base64()}\n"
    return [(path, private, 0o600), (f"{path}.pub", public, 0o644)]


def _sshd_files(paths: _Paths) -> dict[str, str]:
    """The instance sshd's files in the instance's directory (``CMD_*_INSTANCE_SSHD``)."""
    return {
        "config": f"{paths.root}/sshd_config",
        "pidfile": f"{paths.root}/sshd.pid",
        "hostkey": f"{paths.root}/ssh_host_ed25519_key",
        "sshd_log": f"{paths.root}/sshd.log",
    }


def _authorized_keys(spec: InstanceSpec) -> str:
    """The instance owner's key, one line; anything that is not a single key line is dropped."""
    key = " ".join((spec.ssh_public_key or "").split())
    if not key or not re.match(r"^(ssh-|ecdsa-|sk-)[A-Za-z0-9@.-]+ [A-Za-z0-9+/=]+( .*)?$", key):
        return ""
    return key + "\n"


def parse_all_reduce_perf(text: str) -> dict[str, float] | None:
    """nccl-tests' output: the average bus bandwidth and the smallest message's time."""
    busbw = re.search(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", text)
    if busbw is None:
        return None
    latency = None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0].isdigit() and len(fields) >= 8:
            try:
                latency = float(fields[5])  # out-of-place time (us) of the first (smallest) size
            except ValueError:
                continue
            break
    return {"busbw_gbps": float(busbw.group(1)), "latency_us": latency or 0.0}
