"""The real node driver: SSH (paramiko) to each node; one connection carries a node's steps.

Trust and injection, the two things a driver that runs commands as root must get right:

- Host keys are pinned from the inventory (``Node.host_key_fingerprint``: a full public key line
  or its ``SHA256:`` fingerprint) with paramiko's ``RejectPolicy``; a node that presents any other
  key, unknown or changed, is refused after the key exchange and before authentication, so no
  credential is offered and no command runs (``host_key_mismatch``, permanent). There is no
  trust-on-first-use.
- Every remote command is one of the fixed templates in ``commands``, filled by ``render``, which
  ``shlex.quote``s each argument; identifiers that name things on the node (the instance's slug,
  the owner's id, paths, the image) must also match an allow-list pattern up front. Files (the
  hostfile, the environment, authorized_keys) are written with SFTP, never through a shell. The
  user's free text (the instance name, environment values) only ever reaches the node inside the
  environment file, quoted, and is never logged.

Bounded: connect, banner, authentication and channel-open each have the connect timeout; every
command runs under ``timeout`` on the node and a deadline here; keepalives (SSH and TCP) notice
a dropped connection. The connection a node's first step opens is kept for its next steps and
closed after the last one (health, teardown), when idle, or when the driver is dropped. Output (stdout and stderr) is read while the command runs, so a command writing
megabytes cannot fill a window and deadlock; a bounded tail is kept for error messages and only a
rate-limited number of lines reaches the instance's log.

Each node's instance lives in ``<workdir>/instances/<slug>/``: ``env.sh`` (sourced, ``export
NAME='value'``), ``docker.env`` (the names only: docker and enroot take the values from the
sourced environment, so values may hold any byte but NUL, newlines included), ``hostfile``,
``authorized_keys``, ``pid`` and ``output.log`` for a process, and on ``runtime=process`` the
links ``pfs`` and the asset mount points. A container or process is named after the slug, so
every step is idempotent: starting twice reuses what the first start made.
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
