"""The real node driver: SSH (paramiko) to each node; one connection carries a node's steps.

Trust and injection, the two things a driver that runs commands as root must get right:

- Host keys are pinned from the inventory (``Node.host_key_fingerprint``: a full public key line
  or its ``SHA256:`` fingerprint) with paramiko's ``RejectPolicy``; a node that presents any other
  key, unknown or changed, is refused after the key exchange and before authentication, so no
  credential is offered and no command runs (``host_key_mismatch``, permanent). There is no
  trust-on-first-use.
- Every remote command is one of the fixed templates in ``commands``, filled by ``render``, which
  ``shlex.quote``s each argument; identifiers that name things on the node (the instance's slug,
  the owner's id, paths, the image) must also match an allow-list pattern (``fullmatch``) up
  front. Files (the hostfile, the environment, authorized_keys, a launch's argument file) are
  written with SFTP, never through a shell. The user's free text (the instance name, environment
  values) only ever reaches the node inside those files, and is never logged.
- No host shell evaluates the instance's environment, and no command name is looked up where an
  instance could have put a file: every command starts with ``PATH=<SLICES_NODE_PATH>; export
  PATH;``, the runtimes are run by absolute path (SLICES_DOCKER_BIN, SLICES_ENROOT_BIN,
  SLICES_MPIRUN_BIN; ``/usr/bin/setsid``, ``/usr/bin/unshare``, ``/usr/bin/nsenter``,
  ``/usr/bin/xargs``, ``/usr/bin/env``, ``/bin/sh``), and
  the environment reaches the runtime as data: docker's ``--env-file``; for enroot and a bare
  process an argument file (NUL-separated, run by ``xargs -0 -x`` as one command line:
  ``enroot start --env=NAME=value...``, ``env -i NAME=value... /bin/sh -c <entrypoint>``). The
  entrypoint (catalogue data) is run by ``sh -c`` inside the instance only.
- Devices come from the allocation only: ``--gpus '"device=1,3"'`` (every device listed, a whole
  node's too; no ``--gpus`` at all in 无卡模式), and CUDA_VISIBLE_DEVICES/NVIDIA_VISIBLE_DEVICES set
  by the driver over anything in the instance's environment (``void`` when it has no GPU).
- An instance that shares its node gets a network namespace and IPC of its own (docker's bridge,
  ``--ipc private``, the image's ports published on free host ports); a whole node or a node of a
  slice keeps the host's network and IPC (NCCL over InfiniBand). A bare process or enroot cannot
  isolate a share of a node: they run a whole node's instance only, or on a host marked
  ``single_tenant`` (the test hosts), and are refused otherwise (``runtime_not_isolating``).
- One PID namespace per instance (the process rule, SECURITY.md): a container is one; a bare
  process and enroot are launched by ``unshare --pid --fork --kill-child``, and the terminal and
  the instance's sshd join that namespace (``nsenter``), so stop and release end everything the
  instance runs, however it was daemonised. A tunnel to a web port is kept only when every
  listener on the port is the instance's (``SshDriver.open_tunnel``).

Bounded: connect, banner, authentication and channel-open each have the connect timeout; every
command runs under ``timeout`` on the node and a deadline here; keepalives (SSH and TCP) notice
a dropped connection. The connection a node's first step opens is kept for its next steps and
closed after the last one (health, teardown), when idle, or when the driver is dropped. Output (stdout and stderr) is read while the command runs, so a command writing
megabytes cannot fill a window and deadlock; a bounded tail is kept for error messages and only a
rate-limited number of lines reaches the instance's log.

Each node's instance lives in ``<workdir>/instances/<slug>/``: ``environment`` (docker's env-file:
``NAME=value`` lines, so a value may hold any character but NUL and line breaks, which the order
refuses), ``launch.args`` (process, enroot), ``hostfile``, ``authorized_keys``, ``pid`` and
``output.log`` for a process, and on ``runtime=process`` the links ``pfs`` and the asset mount
points. A container or process is named after the slug, so every step is idempotent: starting
twice reuses what the first start made; a stopped docker container is reused only when created
with the same devices, network and environment (its ``gpc.config`` label), else its writable layer
is committed (``gpc-disk/<slug>``) and run again with the new ones.
"""

from __future__ import annotations

from slices.drivers.ssh.client import (
    CommandResult,
    HostKeyRefused,
    SshConnections,
    SshSettings,
    fingerprint,
    parse_key_line,
    pin_host_key,
)
from slices.drivers.ssh.commands import NO_GPU_DRIVER, TAIL_BYTES, env_file, render
from slices.drivers.ssh.driver import STEP_SECONDS, SshDriver, parse_all_reduce_perf

__all__ = [
    "NO_GPU_DRIVER",
    "STEP_SECONDS",
    "TAIL_BYTES",
    "CommandResult",
    "HostKeyRefused",
    "SshConnections",
    "SshDriver",
    "SshSettings",
    "env_file",
    "fingerprint",
    "parse_all_reduce_perf",
    "parse_key_line",
    "pin_host_key",
    "render",
]
