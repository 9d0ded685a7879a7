"""The parallel file system (PFS): each account's directory, its usage against a quota (no
charge), and the checkpoints jobs write there (README "Storage and resilience").

Nodes mount ``<SLICES_PFS_ROOT>/<account>`` at ``/pfs`` (the drivers' mount step); the console
reaches the same file system through ``slices.drivers.pfs.LocalPfs`` to create directories, measure
usage and find the latest checkpoint of an instance's run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from console.tenancy import team_of
from slices.drivers import DriverError, driver_capabilities
from slices.drivers.pfs import Checkpoint, LocalPfs, Usage
from slices.models import Instance, PfsUsage

logger = logging.getLogger(__name__)

GB = 1024**3


def pfs_root() -> Path:
    configured = str(settings.SLICES_PFS_CONSOLE_ROOT)
    if configured:
        return Path(configured)
    if driver_capabilities().simulated:
        return Path(settings.STATE_DIR) / "sim-pfs"
    return Path(settings.SLICES_PFS_ROOT)


def pfs() -> LocalPfs:
    return LocalPfs(pfs_root())


def account_dir(who: Any) -> str:
    """The team's directory name on the PFS (the drivers use the same: ``spec.owner``): a
    personal team keeps its account's public id, so nothing moved when teams came."""
    return team_of(who).pfs_key


def account_root(user: Any) -> Path:
    """The account's directory as the console host sees it (the file browser works under it)."""
    return pfs().account_path(account_dir(user))


def ensure_pfs(user: Any) -> bool:
    """Create the account's PFS directory (before its first instance starts); never raises."""
    try:
        pfs().create(account_dir(user))
    except DriverError as exc:
        logger.warning("PFS directory for %s: %s", account_dir(user), exc)
        return False
    return True


@dataclass(frozen=True)
class PfsSummary:
    used_bytes: int
    files: int
    quota_gb: int
    measured_at: Any

    @property
    def used_gb(self) -> float:
        return round(self.used_bytes / GB, 2)

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.used_bytes / (self.quota_gb * GB))) if self.quota_gb else 0

    @property
    def over_quota(self) -> bool:
        return self.used_bytes > self.quota_gb * GB


def quota_gb(row: PfsUsage | None) -> int:
    if row is not None and row.quota_gb is not None:
        return row.quota_gb
    return int(settings.SLICES_PFS_QUOTA_GB)


def measure_pfs(user: Any) -> PfsSummary:
    """Measure the account's directory now and keep the figure."""
    try:
        usage = pfs().measure(account_dir(user))
    except DriverError as exc:
        logger.warning("measuring the PFS of %s: %s", account_dir(user), exc)
        return pfs_summary(user)
    return remember_usage(user, usage)


def remember_usage(user: Any, usage: Usage) -> PfsSummary:
    """Keep a figure measured now (the file browser measures before it writes: no second walk)."""
    row, _created = PfsUsage.objects.get_or_create(team=team_of(user))
    now = timezone.now()
    PfsUsage.objects.filter(pk=row.pk).update(
        used_bytes=usage.bytes, files=usage.files, measured_at=now
    )
    return PfsSummary(usage.bytes, usage.files, quota_gb(row), now)


def pfs_summary(user: Any) -> PfsSummary:
    """The last measured usage (the page measures when older than a minute)."""
    row = PfsUsage.objects.filter(team=team_of(user)).first()
    if row is None or row.measured_at is None:
        return PfsSummary(0, 0, quota_gb(row), None)
    return PfsSummary(row.used_bytes, row.files, quota_gb(row), row.measured_at)


def fresh_pfs_summary(user: Any, max_age_seconds: int = 60) -> PfsSummary:
    summary = pfs_summary(user)
    if summary.measured_at is None or (
        (timezone.now() - summary.measured_at).total_seconds() > max_age_seconds
    ):
        return measure_pfs(user)
    return summary


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def checkpoint_run(instance: Instance) -> str:
    """The run name under $PFS/checkpoints: ``CHECKPOINT_RUN`` from the order, else the slug."""
    return str((instance.env or {}).get("CHECKPOINT_RUN") or instance.slug)


def latest_checkpoint(instance: Instance) -> Checkpoint | None:
    try:
        return pfs().latest_checkpoint(account_dir(instance.team), checkpoint_run(instance))
    except DriverError:
        return None


def refresh_checkpoint(instance: Instance) -> dict[str, Any]:
    """Look for the instance's latest whole checkpoint and remember it (shown on its page)."""
    found = latest_checkpoint(instance)
    data: dict[str, Any] = found.as_dict() if found else {}
    if data != (instance.checkpoint or {}):
        Instance.objects.filter(pk=instance.pk).update(checkpoint=data)
        instance.checkpoint = data
    return data


def checkpoint_env(instance: Instance) -> dict[str, str]:
    """What a job needs to find its checkpoints (and, after a migration, where to resume)."""
    env = {"CHECKPOINT_DIR": f"/pfs/checkpoints/{checkpoint_run(instance)}"}
    path = (instance.checkpoint or {}).get("path")
    if path:
        env["RESUME_FROM"] = str(path)
    return env
