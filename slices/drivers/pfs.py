"""The parallel file system as the console sees it: each account's directory, its size, and the
checkpoints jobs write there (no ORM; README "Storage and resilience").

Every node of an instance mounts (ssh: links) ``<SLICES_PFS_ROOT>/<account>`` at ``/pfs``; the
console host mounts the same file system at ``root`` to create the directories, measure usage and
find checkpoints. The simulated fleet's PFS is a plain directory on the console host.

Checkpoint convention (documented for recipes): a job writes ``$PFS/checkpoints/<run>/step-<N>/``
(``<run>`` is ``$CHECKPOINT_RUN``, by default the instance's slug) and writes the file
``step-<N>/.incomplete`` first and removes it when the checkpoint is whole. After a migration the
job is started again with ``RESUME_FROM=/pfs/checkpoints/<run>/step-<N>``, the latest whole one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from slices.drivers.base import DriverError

CHECKPOINTS = "checkpoints"
INCOMPLETE = ".incomplete"
_STEP = re.compile(r"^step-(\d{1,12})$")
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SAFE_NAME = _SAFE  # an account's directory, a checkpoint run: one plain name


@dataclass(frozen=True)
class Checkpoint:
    run: str
    step: int
    path: str  # as the job sees it: /pfs/checkpoints/<run>/step-<N>
    at: datetime

    def as_dict(self) -> dict[str, object]:
        return {"run": self.run, "step": self.step, "path": self.path, "at": self.at.isoformat()}


@dataclass(frozen=True)
class Usage:
    bytes: int
    files: int


class LocalPfs:
    """The PFS mounted on the console host at ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _account(self, owner: str) -> Path:
        if not _SAFE.match(owner):
            raise DriverError(
                "bad_owner", f"not an account directory name: {owner!r}", permanent=True
            )
        return self.root / owner

    def account_path(self, owner: str) -> Path:
        """The account's directory (its name checked: never a path of the caller's making)."""
        return self._account(owner)

    def create(self, owner: str) -> Path:
        """The account's directory (and its checkpoints directory); idempotent."""
        path = self._account(owner)
        try:
            (path / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DriverError("pfs_unavailable", f"{self.root}: {exc.strerror}") from exc
        return path

    def measure(self, owner: str) -> Usage:
        """Bytes and files under the account's directory (symlinks are not followed)."""
        path = self._account(owner)
        total = files = 0
        if not path.is_dir():
            return Usage(0, 0)
        for dirpath, _dirs, names in os.walk(path):
            for name in names:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue  # removed while walking
                total += st.st_size
                files += 1
        return Usage(total, files)

    def latest_checkpoint(self, owner: str, run: str) -> Checkpoint | None:
        """The highest whole ``step-<N>`` of ``run`` (one with ``.incomplete`` is skipped)."""
        if not _SAFE.match(run):
            return None
        base = self._account(owner) / CHECKPOINTS / run
        if not base.is_dir():
            return None
        best: tuple[int, Path] | None = None
        for entry in base.iterdir():
            m = _STEP.match(entry.name)
            if not m or not entry.is_dir() or (entry / INCOMPLETE).exists():
                continue
            step = int(m.group(1))
            if best is None or step > best[0]:
                best = (step, entry)
        if best is None:
            return None
        at = datetime.fromtimestamp(best[1].stat().st_mtime, tz=UTC)
        return Checkpoint(run, best[0], f"/pfs/{CHECKPOINTS}/{run}/{best[1].name}", at)
