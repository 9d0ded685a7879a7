"""A hostile tenant against the node boundary (issue 17), on real sshd test hosts.

What a tenant controls reaches a node only as data: environment names and values, the instance
name, files and symlinks planted in their own PFS directory. Every attempt here would leave a
marker file on the host if any of it were evaluated by the host's shell, or if a binary the tenant
planted ever ran in its place; the marker never appears. The docker-shaped template runs against a
fake ``docker`` (no engine on this machine) that records each call (argv, the host PATH it was
called under, the --env-file it was given) and runs the "container" as a plain process, so the
same ``CMD_START_DOCKER`` the nodes run is exercised; the bare-process template runs for real.
Order-time refusals go through the API.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from billing import services as billing
from slices import envpolicy
from slices.drivers.base import DriverError, InstanceSpec, Mount, NodeTarget
from slices.drivers.ssh import SshDriver, SshSettings
from slices.drivers.ssh.commands import NODE_PATH
from slices.fleetfile import FleetFileError, parse_fleet
from slices.models import Instance, Node
from slices.services.fleet import load_fleet
from slices.services.provisioning import node_target
from tests.support.sshd import (  # noqa: F401
    SshHost,
    SshHostPool,
    process_alive,
    ssh_hosts,
    workload_pid,
)

SLUG = "gpc-0badc0de"
OWNER = "hostile-tenant"
# What a tenant's planted binaries would do if anything ran them.
PLANTED = (
    "setsid", "docker", "env", "sh", "xargs", "timeout", "sleep", "tail", "cat", "kill", "rm",
    "ln", "mkdir", "grep", "tar", "id", "nvidia-smi", "mpirun", "enroot", "python3", "bash",
)  # fmt: skip
# Values a tenant may set, which must arrive exactly as written (nothing evaluates them).
LITERAL = {
    "SUBST": "$(touch {m})",
    "BACKTICKS": "`touch {m}`",
    "QUOTES": "' \" \\ ; touch {m} | touch {m} & touch {m}",
    "EXPAND": "${{PATH}}:$HOME:~/x",
    "UNICODE": "café 中文 \u202e",
    "LONG": "x" * envpolicy.MAX_VALUE_CHARS,
    "EMPTY": "",
}

# The fake docker: records every call, keeps containers as plain processes in its state dir.
FAKE_DOCKER = r"""#!{python}
import json, os, shutil, signal, subprocess, sys

STATE, LOG = {state!r}, {log!r}
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VALUED = {{"--name", "--label", "--gpus", "--network", "--ipc", "--ulimit", "--device",
          "--cap-add", "--env-file", "-p", "-v", "--format"}}


def record(**extra):
    with open(LOG, "a") as f:
        f.write(json.dumps({{"argv": sys.argv[1:], "path": os.environ.get("PATH", ""),
                            "environ": sorted(os.environ), **extra}}) + "\n")


def cdir(name):
    return os.path.join(STATE, "containers", name)


def load(name):
    try:
        with open(os.path.join(cdir(name), "config.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(name, config):
    with open(os.path.join(cdir(name), "config.json"), "w") as f:
        json.dump(config, f)


def alive(pid):
    try:
        with open(f"/proc/{{pid}}/status") as f:
            return not any(l.startswith("State:") and "Z" in l.split()[1] for l in f)
    except (FileNotFoundError, TypeError):
        return False


def images():
    try:
        with open(os.path.join(STATE, "images.json")) as f:
            return set(json.load(f))
    except FileNotFoundError:
        return set()


def set_images(names):
    with open(os.path.join(STATE, "images.json"), "w") as f:
        json.dump(sorted(names), f)


def spawn(name, config):
    env = {{"PATH": IMAGE_PATH, "HOSTNAME": name}}
    env.update(config["env"])
    command = config["command"] or ["sleep", "infinity"]
    if "/" not in command[0]:  # the image's own binaries: never the host's or the tenant's PATH
        command = [shutil.which(command[0], path=IMAGE_PATH) or command[0]] + command[1:]
    rootfs = os.path.join(cdir(name), "rootfs")
    os.makedirs(rootfs, exist_ok=True)
    with open(os.path.join(cdir(name), "log"), "ab") as out:
        proc = subprocess.Popen(command, env=env, cwd=rootfs, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    config["pid"] = proc.pid
    save(name, config)


def stop(config):
    pid = config.get("pid")
    if alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def env_file(path):
    env = {{}}
    with open(path) as f:
        for line in f.read().split("\n"):
            line = line.lstrip()
            if not line or line.startswith("#"):
                continue
            name, _, value = line.partition("=")
            env[name] = value
    return env


def run(args):
    opts, i = {{}}, 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        if "=" in arg and arg.split("=", 1)[0] in VALUED:
            key, value = arg.split("=", 1)
            opts.setdefault(key, []).append(value)
        elif arg in VALUED:
            opts.setdefault(arg, []).append(args[i + 1])
            i += 1
        else:
            opts.setdefault(arg, []).append("")
        i += 1
    image, command = args[i], args[i + 1:]
    name = opts["--name"][0]
    if load(name) is not None:
        print(f"Conflict: the container name {{name}} is already in use", file=sys.stderr)
        sys.exit(125)
    gpus = opts.get("--gpus", [])
    devices = gpus[0].strip('"').removeprefix("device=").split(",") if gpus else []
    envfile = opts["--env-file"][0]
    with open(envfile) as f:
        content = f.read()
    record(env_file=content)
    os.makedirs(cdir(name), exist_ok=True)
    label = dict(l.split("=", 1) for l in opts.get("--label", []))
    config = {{"image": image, "command": command, "env": env_file(envfile), "devices": devices,
              "labels": label, "ports": opts.get("-p", []), "opts": opts}}
    spawn(name, config)
    print("f" * 12 + name)


def main():
    args = sys.argv[1:]
    os.makedirs(os.path.join(STATE, "containers"), exist_ok=True)
    if args[:1] != ["run"]:
        record()
    if args[:2] == ["container", "inspect"]:
        rest = args[2:]
        fmt = rest[rest.index("--format") + 1] if "--format" in rest else ""
        config = load(rest[-1])
        if config is None:
            print(f"Error: No such container: {{rest[-1]}}", file=sys.stderr)
            sys.exit(1)
        if fmt == "{{{{.State.Running}}}}":
            print("true" if alive(config.get("pid")) else "false")
        elif "gpc.config" in fmt:
            print(config["labels"].get("gpc.config", ""))
        else:
            print(json.dumps(config))
    elif args[:2] == ["image", "inspect"]:
        sys.exit(0 if args[2] in images() else 1)
    elif args[:2] == ["image", "rm"]:
        set_images(images() - {{args[-1]}})
    elif args[:1] == ["run"]:
        run(args[1:])
    elif args[:1] == ["start"]:
        config = load(args[1])
        if config is None:
            sys.exit(1)
        if not alive(config.get("pid")):
            spawn(args[1], config)
    elif args[:1] == ["stop"]:
        config = load(args[1])
        if config is not None:
            stop(config)
    elif args[:1] == ["rm"]:
        config = load(args[-1])
        if config is not None:
            stop(config)
            shutil.rmtree(cdir(args[-1]))
    elif args[:1] == ["commit"]:
        set_images(images() | {{args[2]}})
    elif args[:1] == ["exec"]:
        config = load(args[1])
        if config is None or not alive(config.get("pid")):
            sys.exit(1)
        if args[2:] == ["nvidia-smi", "-L"]:
            if not config["devices"]:
                print("exec: nvidia-smi: executable file not found in $PATH", file=sys.stderr)
                sys.exit(127)
            for i, d in enumerate(config["devices"]):
                print(f"GPU {{i}}: NVIDIA Fake (UUID: GPU-fake-host-index-{{d}})")
        else:
            sys.exit(126)
    elif args[:1] == ["logs"]:
        with open(os.path.join(cdir(args[1]), "log"), "rb") as f:
            sys.stdout.buffer.write(f.read())
    elif args[:1] == ["port"]:
        config = load(args[1]) or {{"ports": []}}
        for n, p in enumerate(config["ports"]):
            print(f"{{p}}/tcp -> 0.0.0.0:{{49000 + n}}")
    else:
        print(f"fake docker: unsupported {{args}}", file=sys.stderr)
        sys.exit(2)


main()
"""


class Logs(list[str]):
    def __call__(self, line: str) -> None:
        self.append(line)


class FakeDocker:
    """The fake docker binary and what it recorded."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.binary = directory / "docker"
        self.log = directory / "calls.jsonl"
        self.state = directory / "state"
        self.state.mkdir(parents=True)
        self.binary.write_text(
            FAKE_DOCKER.format(python=sys.executable, state=str(self.state), log=str(self.log))
        )
        self.binary.chmod(0o755)

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def runs(self) -> list[dict[str, Any]]:
        return [c for c in self.calls() if c["argv"][:1] == ["run"]]

    def container(self, name: str) -> dict[str, Any]:
        return json.loads((self.state / "containers" / name / "config.json").read_text())


@pytest.fixture
def host(ssh_hosts: SshHostPool) -> SshHost:  # noqa: F811
    return ssh_hosts.get(1)[0]


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    paths = {k: tmp_path / k for k in ("node", "pfs", "assets", "victim")}
    for p in paths.values():
        p.mkdir()
    (paths["assets"] / "models" / "org" / "tiny").mkdir(parents=True)
    return paths


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "host-marker"
    yield path
    assert not path.exists(), "something the tenant controlled ran on the host"


@pytest.fixture
def planted(roots: dict[str, Path], marker: Path) -> Path:
    """The tenant's PFS directory with binaries named after everything the host runs, and
    symlinks to host paths (an ``etc``, the root's keys, a host directory with a file in it)."""
    pfs = roots["pfs"] / OWNER
    (pfs / "bin").mkdir(parents=True)
    for name in PLANTED:
        script = pfs / "bin" / name
        script.write_text(f'#!/bin/sh\necho "$(id -u) $PWD $0" >> {marker}\n')
        script.chmod(0o755)
    (roots["victim"] / "keep").write_text("host file\n")
    os.symlink(roots["victim"], pfs / "victim")
    os.symlink("/etc", pfs / "etc")
    os.symlink("/root/.ssh", pfs / "root-ssh")
    os.symlink(pfs / "bin" / "sh", pfs / "sh")
    return pfs


@pytest.fixture
def docker(tmp_path: Path) -> FakeDocker:
    return FakeDocker(tmp_path / "fake-docker")


def make_driver(pool: SshHostPool, roots: dict[str, Path], docker: FakeDocker) -> SshDriver:
    return SshDriver(
        SshSettings(
            key_file=str(pool.client_key),
            pfs_root=str(roots["pfs"]),
            asset_root=str(roots["assets"]),
            connect_timeout=5.0,
            command_timeout=30.0,
            docker_bin=str(docker.binary),
        )
    )


@pytest.fixture
def driver(ssh_hosts: SshHostPool, roots: dict[str, Path], docker: FakeDocker) -> SshDriver:  # noqa: F811
    return make_driver(ssh_hosts, roots, docker)


def make_node(
    host: SshHost,
    roots: dict[str, Path],
    runtime: str,
    gpus: tuple[int, ...],
    *,
    single_tenant: bool = False,
) -> NodeTarget:
    return NodeTarget(
        hostname="hostile-n01",
        address=host.address,
        port=host.port,
        host_key=host.host_key_line,
        rank=0,
        gpus=gpus,
        workdir=str(roots["node"]),
        runtime=runtime,
        node_gpus=8,
        single_tenant=single_tenant,
    )


def make_spec(node: NodeTarget, **kw: Any) -> InstanceSpec:
    fields: dict[str, Any] = {
        "instance_id": "6f1c7a52-0000-4000-8000-00000000bad0",
        "slug": SLUG,
        "name": "box $(touch /tmp/x) `id`",
        "owner": OWNER,
        "image": "registry.example.com/pytorch:2.3" if node.runtime != "process" else "",
        "entrypoint": "",
        "env": {},
        "mounts": (Mount("/pfs/public/models/org/tiny", "/models/tiny"),),
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOr0test tenant@laptop",
        "nodes": (node,),
        "gpus_per_node": len(node.gpus),
        **kw,
    }
    return InstanceSpec(**fields)


def instance_dir(roots: dict[str, Path]) -> Path:
    return roots["node"] / "instances" / SLUG


def env_lines(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().split("\n") if line)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


# ---------------------------------------------------------------------------------------------
# The whole life of an instance, with everything a tenant may legally send
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", ["docker", "process"])
def test_a_hostile_tenants_instance_runs_nothing_of_theirs_on_the_host(
    driver: SshDriver,
    host: SshHost,
    roots: dict[str, Path],
    planted: Path,
    marker: Path,
    docker: FakeDocker,
    runtime: str,
) -> None:
    # A share of an 8-GPU node (docker), or the single-tenant test host (a bare process).
    node = make_node(host, roots, runtime, (1, 3), single_tenant=runtime == "process")
    literal = {k: v.format(m=marker) for k, v in LITERAL.items()}
    # The tenant's device list reaches the driver only past the order check (a row edited in
    # the database): the allocation still decides.
    widen = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NVIDIA_VISIBLE_DEVICES": "all"}
    # Catalogue data, run by the instance's own shell: it names binaries the tenant planted.
    entrypoint = "env >/dev/null; sh -c true; exec sleep 300" if runtime == "process" else ""
    spec = make_spec(node, env={**literal, **widen}, entrypoint=entrypoint, ports=(8888,))
    logs = Logs()
    for step in (driver.connect, driver.prepare, driver.mount, driver.start, driver.health):
        step(spec, node, logs)

    root = instance_dir(roots)
    assert not (root / "env.sh").exists()
    written = env_lines(root / "environment")
    for name, value in literal.items():
        assert written[name] == value
    assert written["INSTANCE_NAME"] == spec.name
    assert written["NVIDIA_VISIBLE_DEVICES"] == "1,3"
    if runtime == "docker":
        # The container numbers its two devices from 0; --gpus says which ones they are.
        assert written["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert "PATH" not in written
        (run,) = docker.runs()
        argv = run["argv"]
        assert argv[argv.index("--gpus") + 1] == '"device=1,3"'
        assert argv[argv.index("--env-file") + 1] == str(root / "environment")
        assert run["env_file"] == (root / "environment").read_text()
        assert argv[argv.index("--network") + 1] == "bridge"
        assert argv[argv.index("--ipc") + 1] == "private"
        published = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
        # The image's port on the node's loopback only (the console's proxy reaches it over SSH);
        # nothing is published on every interface.
        assert "host" not in argv and "127.0.0.1::8888" in published
        assert all(p.count(":") >= 2 for p in published), published
        assert not any("infiniband" in a for a in argv)
        container = docker.container(SLUG)
        inside = environ_of(container["pid"])
        assert inside["SUBST"] == literal["SUBST"] and inside["LONG"] == literal["LONG"]
        assert inside["NVIDIA_VISIBLE_DEVICES"] == "1,3"
        # Every docker call: by absolute path under the fixed PATH, the tenant's names absent
        # from the host shell's environment (nothing was sourced or exported there).
        for call in docker.calls():
            assert call["path"] == NODE_PATH
            assert not set(call["environ"]) & set(literal), call["argv"]
    else:
        assert written["CUDA_VISIBLE_DEVICES"] == "1,3"
        assert written["PATH"] == NODE_PATH
        launcher = int((root / "pid").read_text())
        # The launcher (xargs, run by the host shell) has none of the tenant's variables...
        assert not set(environ_of(launcher)) & set(literal)
        # ...the instance's process has exactly its environment.
        inside = environ_of(workload_pid(launcher))
        assert {k: inside[k] for k in literal} == literal
        assert inside["PATH"] == NODE_PATH
        assert inside["CUDA_VISIBLE_DEVICES"] == "1,3"

    out = driver.workload_output(spec, node, 0, 0.0, 10)
    assert out.running
    driver.stop(spec, node, logs)
    again = driver.start(spec, node, logs)
    assert again.data["reused"] is (runtime == "docker")  # a stopped container is kept
    driver.teardown(spec, node, logs)

    assert not marker.exists()
    assert not root.exists()
    # What the tenant's links point at is untouched (rm, tar and ln never follow them).
    assert (roots["victim"] / "keep").read_text() == "host file\n"
    assert (planted / "bin" / "setsid").exists() and os.path.islink(planted / "victim")
    assert os.path.isdir("/etc") and os.path.isdir("/root")
    for line in logs:
        assert "touch" not in line and literal["LONG"] not in line


def test_moving_the_system_disk_keeps_the_tenants_links_as_links(
    driver: SshDriver, host: SshHost, roots: dict[str, Path], planted: Path, tmp_path: Path
) -> None:
    src = make_node(host, roots, "process", (0,), single_tenant=True)
    dst = replace(src, hostname="hostile-n02", workdir=str(tmp_path / "other-node"))
    spec = make_spec(src)
    for step in (driver.prepare, driver.mount):
        step(spec, src, Logs())
    # The tenant's process (root on a single-tenant host) left a link to a host path inside.
    os.symlink(roots["victim"], instance_dir(roots) / "escape")
    driver.move_disk(spec, src, dst, Logs())
    moved = tmp_path / "other-node" / "instances" / SLUG
    assert os.readlink(moved / "escape") == str(roots["victim"])
    assert os.readlink(moved / "pfs") == str(planted)
    driver.teardown(spec, dst, Logs())
    driver.teardown(spec, src, Logs())
    assert (roots["victim"] / "keep").read_text() == "host file\n"


# ---------------------------------------------------------------------------------------------
# What the driver refuses whoever asked (a row edited past the order's checks)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"PATH": "{pfs}/bin:/usr/bin:/bin"},
        {"LD_PRELOAD": "{pfs}/evil.so"},
        {"LD_LIBRARY_PATH": "{pfs}"},
        {"BASH_ENV": "{pfs}/sh"},
        {"ENV": "{pfs}/sh"},
        {"IFS": "/"},
        {"PS4": "$(touch {m})"},
        {"SHELLOPTS": "xtrace"},
        {"ENROOT_ALLOW_SUPERUSER": "y"},
        {"A\n": "x"},
        {"A=B": "x"},
        {"lower": "x"},
        {"CAFÉ": "x"},
        {"1A": "x"},
        {"NOTE": "one\ntouch {m}"},
        {"NOTE": "one\rtwo"},
        {"NOTE": "x" * (envpolicy.MAX_VALUE_CHARS + 1)},
    ],
    ids=lambda env: repr(next(iter(env)))[:30],
)
@pytest.mark.parametrize("runtime", ["docker", "process"])
def test_the_driver_refuses_an_environment_it_cannot_pass_as_plain_data(
    driver: SshDriver,
    host: SshHost,
    roots: dict[str, Path],
    planted: Path,
    marker: Path,
    runtime: str,
    env: dict[str, str],
) -> None:
    node = make_node(host, roots, runtime, (0,), single_tenant=True)
    values = {k: v.format(pfs=planted, m=marker) for k, v in env.items()}
    spec = make_spec(node, env=values)
    for step in (driver.prepare, driver.start):
        with pytest.raises(DriverError) as refused:
            step(spec, node, Logs())
        assert refused.value.code == "bad_environment" and refused.value.permanent
    assert not instance_dir(roots).exists()


@pytest.mark.parametrize(
    ("what", "value"),
    [
        ("target", "/etc"),
        ("target", "/usr/bin"),
        ("target", "/proc"),
        ("target", "/root/.ssh"),
        ("target", "/pfs"),
        ("target", "/"),
        ("target", "/models"),
        ("target", "/models/../etc"),
        ("target", "models/relative"),
        ("target", "/models/x\n"),
        ("source", "/pfs/public/../../etc"),
        ("source", "/pfs/public/models/../../../root/.ssh"),
        ("slug", "../../etc"),
        ("slug", "gpc-x\n"),
        ("owner", ".."),
        ("owner", "a/../../etc"),
    ],
)
@pytest.mark.parametrize("runtime", ["docker", "process"])
def test_names_and_mount_targets_outside_the_allow_list_are_refused(
    driver: SshDriver,
    host: SshHost,
    roots: dict[str, Path],
    marker: Path,
    runtime: str,
    what: str,
    value: str,
) -> None:
    node = make_node(host, roots, runtime, (0,), single_tenant=True)
    if what == "target":
        spec = make_spec(node, mounts=(Mount("models/org/tiny", value),))
    elif what == "source":
        spec = make_spec(node, mounts=(Mount(value, "/models/tiny"),))
    else:
        spec = make_spec(node, **{what: value})
    with pytest.raises(DriverError) as refused:
        for step in (driver.prepare, driver.mount, driver.start):
            step(spec, node, Logs())
    assert refused.value.code == "bad_identifier" and refused.value.permanent
    shutil.rmtree(instance_dir(roots), ignore_errors=True)  # prepare may have written it


# ---------------------------------------------------------------------------------------------
# Devices and network come from the allocation
# ---------------------------------------------------------------------------------------------


def test_docker_devices_and_network_follow_the_allocation_not_the_tenant(
    driver: SshDriver, host: SshHost, roots: dict[str, Path], planted: Path, docker: FakeDocker
) -> None:
    widen = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NVIDIA_VISIBLE_DEVICES": "all"}

    # A whole node: every device listed (never "all"), the host's network and IPC (NCCL).
    whole = make_node(host, roots, "docker", tuple(range(8)))
    spec = make_spec(whole, env=widen, ports=(8888,))
    for step in (driver.prepare, driver.mount, driver.start, driver.health):
        step(spec, whole, Logs())
    argv = docker.runs()[-1]["argv"]
    assert argv[argv.index("--gpus") + 1] == '"device=0,1,2,3,4,5,6,7"'
    assert argv[argv.index("--network") + 1] == "host" and argv[argv.index("--ipc") + 1] == "host"
    assert "-p" not in argv
    assert env_lines(instance_dir(roots) / "environment")["NVIDIA_VISIBLE_DEVICES"] == (
        "0,1,2,3,4,5,6,7"
    )

    # 关机, then 开机 on the same host in 无卡模式: the stopped container was made with eight
    # devices, so it is not reused; its writable layer is committed and run again with none.
    driver.stop(spec, whole, Logs())
    gpuless = replace(whole, gpus=())
    spec = make_spec(gpuless, env=widen, ports=(8888,))
    logs = Logs()
    for step in (driver.prepare, driver.mount, driver.start):
        step(spec, gpuless, logs)
    assert any(c["argv"][:1] == ["commit"] for c in docker.calls())
    run = docker.runs()[-1]
    argv = run["argv"]
    assert "--gpus" not in argv and argv[-3:] != ["registry.example.com/pytorch:2.3"]
    assert argv[argv.index("--network") + 1] == "bridge" and "host" not in argv
    assert "NVIDIA_VISIBLE_DEVICES=void\n" in run["env_file"]
    assert "CUDA_VISIBLE_DEVICES=\n" in run["env_file"]
    assert driver.health(spec, gpuless, Logs()).data == {"gpus_visible": 0}
    inside = environ_of(docker.container(SLUG)["pid"])
    assert inside["NVIDIA_VISIBLE_DEVICES"] == "void" and inside["CUDA_VISIBLE_DEVICES"] == ""
    driver.teardown(spec, gpuless, Logs())
    assert not (docker.state / "containers" / SLUG).exists()

    # One card of a shared node: that card only, its own network, the image's port published.
    one = make_node(host, roots, "docker", (5,))
    spec = make_spec(one, env=widen, ports=(8888,))
    for step in (driver.prepare, driver.mount, driver.start):
        step(spec, one, Logs())
    argv = docker.runs()[-1]["argv"]
    assert argv[argv.index("--gpus") + 1] == '"device=5"'
    published = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert "127.0.0.1::8888" in published and "host" not in argv
    assert driver.health(spec, one, Logs()).data == {"gpus_visible": 1}
    env = env_lines(instance_dir(roots) / "environment")
    assert (env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"]) == ("0", "5")
    driver.teardown(spec, one, Logs())


@pytest.mark.parametrize("runtime", ["process", "enroot"])
@pytest.mark.parametrize("gpus", [(1,), ()], ids=["one-card", "gpuless"])
def test_a_runtime_that_cannot_isolate_is_refused_on_a_shared_node(
    driver: SshDriver,
    host: SshHost,
    roots: dict[str, Path],
    runtime: str,
    gpus: tuple[int, ...],
) -> None:
    node = make_node(host, roots, runtime, gpus)
    spec = make_spec(node)
    for step in (driver.prepare, driver.start):
        with pytest.raises(DriverError) as refused:
            step(spec, node, Logs())
        assert refused.value.code == "runtime_not_isolating" and refused.value.permanent
        assert "single_tenant" in refused.value.detail
    assert not instance_dir(roots).exists()
    # The whole node is the instance's: nothing else shares it.
    whole = replace(node, gpus=tuple(range(8)))
    driver.prepare(make_spec(whole), whole, Logs())
    driver.teardown(make_spec(whole), whole, Logs())


def test_enroot_gets_the_environment_as_arguments_and_none_of_it_in_its_own(
    ssh_hosts: SshHostPool,  # noqa: F811
    host: SshHost,
    roots: dict[str, Path],
    docker: FakeDocker,
    planted: Path,
    marker: Path,
    tmp_path: Path,
) -> None:
    """enroot is a bash script run as root: the tenant's variables are ``--env=NAME=value``
    arguments (enroot writes them into the container's environment file), never its own."""
    record = tmp_path / "enroot.txt"
    enroot = tmp_path / "enroot"
    enroot.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  import) touch "$3";;\n'
        "  list|create|remove) ;;\n"
        f'  start) printf "%s\\0" "$@" > {record}; env > {record}.tmp; '
        f"mv {record}.tmp {record}.env; exec sleep 30;;\n"
        "esac\n"
    )
    enroot.chmod(0o755)
    driver = SshDriver(
        replace(make_driver(ssh_hosts, roots, docker).settings, enroot_bin=str(enroot))
    )
    node = make_node(host, roots, "enroot", tuple(range(8)))
    literal = {k: v.format(m=marker) for k, v in LITERAL.items()}
    spec = make_spec(node, env=literal, entrypoint="exec sleep 300")
    for step in (driver.prepare, driver.mount, driver.start):
        step(spec, node, Logs())
    deadline = time.monotonic() + 5
    while not (record.exists() and Path(f"{record}.env").exists()) and time.monotonic() < deadline:
        time.sleep(0.02)
    argv = record.read_bytes().decode().split("\0")[:-1]
    assert argv[:2] == ["start", "--rw"]
    assert f"--mount={planted}:/pfs:none:x-create=dir,bind" in argv
    for name, value in literal.items():
        assert f"--env={name}={value}" in argv
    assert "--env=NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in argv
    assert argv[-5:] == ["--", SLUG, "/bin/sh", "-c", "exec sleep 300"]
    own = dict(line.split("=", 1) for line in Path(f"{record}.env").read_text().splitlines())
    assert not set(own) & set(literal) and own["PATH"] == NODE_PATH
    driver.teardown(spec, node, Logs())


def test_the_all_reduce_check_exports_only_the_consoles_values(
    ssh_hosts: SshHostPool,  # noqa: F811
    host: SshHost,
    roots: dict[str, Path],
    docker: FakeDocker,
    tmp_path: Path,
    marker: Path,
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    record = tmp_path / "mpirun.txt"
    for name, body in {
        "mpirun": f'printf "%s\\n" "$@" > {record}; env >> {record}; '
        'echo "# Avg bus bandwidth    : 42.5"',
        "all_reduce_perf": "exit 0",
        "nvidia-smi": "exit 0",
    }.items():
        (tools / name).write_text(f"#!/bin/sh\n{body}\n")
        (tools / name).chmod(stat.S_IRWXU)
    driver = SshDriver(
        replace(
            make_driver(ssh_hosts, roots, docker).settings,
            node_path=f"{tools}:{NODE_PATH}",
            mpirun_bin=str(tools / "mpirun"),
        )
    )
    node = make_node(host, roots, "docker", tuple(range(8)))
    spec = make_spec(node, env={"NOTE": f"$(touch {marker})", "NCCL_DEBUG": "INFO"})
    result = driver.allreduce_check(spec, Logs())
    assert result.data["measured"] is True and result.data["busbw_gbps"] == 42.5
    argv, _, env = record.read_text().partition("PATH=")
    assert "MASTER_ADDR=127.0.0.1" in argv.split("\n")
    assert str(tools / "all_reduce_perf") in argv.split("\n")
    assert "NOTE" not in argv and "NOTE" not in env and "NCCL_DEBUG" not in env


# ---------------------------------------------------------------------------------------------
# The order refuses what the platform owns, naming it
# ---------------------------------------------------------------------------------------------

URL = "/api/v1/instances/"


def _api(user: Any) -> APIClient:
    billing.grant_voucher(user, Decimal("5000"), reason="test", valid_days=30)
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.django_db
def test_an_order_naming_the_platforms_variables_is_refused_with_each_name(
    sim_fleet: None, alice: Any
) -> None:
    owned = [
        "PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "IFS", "PS4", "SHELLOPTS",
        "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NCCL_IB_HCA", "RESUME_FROM",
        "CHECKPOINT_DIR", "PFS", "GPC_ANYTHING", "SIM_FAIL", "RECIPE", "RECIPE_DIR",
        "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE", "RUN_NAME", "TIME_LIMIT_S",
        "ENROOT_ROOTFS_WRITABLE",
    ]  # fmt: skip
    assert len(owned) <= 32 - 2
    env = dict.fromkeys(owned, "x") | {"MY_SETTING": "1", "GPC_RELEASE_WHEN_IDLE": "1"}
    r = _api(alice).post(URL, {"gpu_model": "RTX4090", "cards": 1, "env": env}, format="json")
    assert r.status_code == 400, r.json()
    body = r.json()
    assert body["error"] == "invalid"
    for name in owned:
        assert name in body["detail"], name
    assert "MY_SETTING" not in body["detail"] and "GPC_RELEASE_WHEN_IDLE" not in body["detail"]
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_a_one_card_order_cannot_widen_its_devices(sim_fleet: None, alice: Any) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    r = _api(alice).post(URL, {"gpu_model": "RTX4090", "cards": 1, "env": env}, format="json")
    assert r.status_code == 400 and "CUDA_VISIBLE_DEVICES" in r.json()["detail"]
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_an_order_with_a_name_or_value_the_node_cannot_carry_is_refused(
    sim_fleet: None, alice: Any
) -> None:
    api = _api(alice)
    for env in [
        {"A\n": "x"},
        {"A=B": "x"},
        {"lower": "x"},
        {"CAFÉ": "x"},
        {"A B": "x"},
        {"../A": "x"},
        {"": "x"},
        {"NOTE": "one\ntouch /tmp/x"},
        {"NOTE": "one\rtwo"},
        {"NOTE": "x" * (envpolicy.MAX_VALUE_CHARS + 1)},
    ]:
        r = api.post(URL, {"gpu_model": "RTX4090", "cards": 1, "env": env}, format="json")
        assert r.status_code == 400, (env, r.json())
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_literal_values_are_accepted_and_stored_as_written(
    sim_fleet: None, alice: Any, django_capture_on_commit_callbacks: Any
) -> None:
    env = {k: v.format(m="/tmp/never") for k, v in LITERAL.items()}
    with django_capture_on_commit_callbacks(execute=True):
        r = _api(alice).post(URL, {"gpu_model": "RTX4090", "cards": 1, "env": env}, format="json")
    assert r.status_code == 202, r.json()
    assert Instance.objects.get().env == env


def test_the_consoles_job_values_win_over_the_instances_environment() -> None:
    node = NodeTarget("n", "10.0.0.1", 22, "SHA256:x", 1, (0,), node_gpus=8)
    spec = InstanceSpec(
        instance_id="i",
        slug=SLUG,
        name="n",
        owner=OWNER,
        image="",
        entrypoint="",
        env={"NODE_RANK": "0", "MASTER_ADDR": "10.9.9.9", "WORLD_SIZE": "1024", "X": "1"},
        mounts=(),
        ssh_public_key="",
        nodes=(replace(node, rank=0), node),
        gpus_per_node=1,
    )
    env = spec.job_env(node)
    assert (env["NODE_RANK"], env["MASTER_ADDR"], env["WORLD_SIZE"]) == ("1", "10.0.0.1", "2")
    assert env["X"] == "1"


# ---------------------------------------------------------------------------------------------
# The fleet file: a bare process only on hosts one tenant uses at a time
# ---------------------------------------------------------------------------------------------

FLEET = """\
version: 1
gpu_models:
  - {code: RTX4090, memory_gib: 24}
regions:
  - code: lab
    name: Lab
    clusters:
      - code: lab-4090
        gpu_model: RTX4090
        fabric: ethernet
        gpus_per_node: 8
        nodes: 5
        su_nodes: 5
        hostname: "lab-n{node:02d}"
        address: "10.9.0.{node}"
"""


def test_the_fleet_file_refuses_a_bare_process_on_a_node_tenants_could_share() -> None:
    with pytest.raises(FleetFileError) as refused:
        parse_fleet(FLEET + "        runtime: process\n", source="fleet.yaml")
    message = str(refused.value)
    assert message.startswith("fleet.yaml:16: ")  # the runtime line
    assert "lab-n01" in message and "single_tenant: true" in message
    with pytest.raises(FleetFileError, match="not one of docker, enroot, process"):
        parse_fleet(FLEET + "        runtime: podman\n")
    with pytest.raises(FleetFileError, match="'single_tenant' must be bool"):
        parse_fleet(FLEET + "        runtime: process\n        single_tenant: 'yes'\n")
    spec = parse_fleet(FLEET + "        runtime: process\n        single_tenant: true\n")
    assert (spec.clusters[0].runtime, spec.clusters[0].single_tenant) == ("process", True)
    assert parse_fleet(FLEET).clusters[0].runtime == ""


@pytest.mark.django_db
def test_the_nodes_carry_the_fleet_files_runtime_to_the_driver() -> None:
    load_fleet(parse_fleet(FLEET + "        runtime: process\n        single_tenant: true\n"))
    node = Node.objects.get(hostname="lab-n01")
    target = node_target(node, 0, 0b10)
    assert (target.runtime, target.single_tenant, target.gpus) == ("process", True, (1,))
    assert target.node_gpus == 8 and not target.exclusive
    assert node_target(node, 0, 0xFF).exclusive
