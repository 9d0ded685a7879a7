"""The parallel file system as the console sees it: each account's directory, its size, and the
checkpoints jobs write there (no ORM; README "Storage and resilience").

Every node of an instance mounts (ssh: links) ``<SLICES_PFS_ROOT>/<account>`` at ``/pfs``; the
console host mounts the same file system at ``root`` to create the directories, measure usage and
find checkpoints. The simulated fleet's PFS is a plain directory on the console host.

Checkpoint convention (documented for recipes): a job writes ``$PFS/checkpoints/<run>/step-<N>/``
(``<run>`` is ``$CHECKPOINT_RUN``, by default the instance's slug) and writes the file
``step-<N>/.incomplete`` first and removes it when the checkpoint is whole. After a migration the
job is started again with ``RESUME_FROM=/pfs/checkpoints/<run>/step-<N>``, the latest whole one.

Everything under an account's directory is the tenant's to shape (root inside an instance writes
there), symlinks included. The console host never follows one (SECURITY.md, issue 29): every walk
below goes from the account's directory one name at a time through directory descriptors opened
with ``O_NOFOLLOW`` (``openat``), and reads what it finds with ``lstat`` relative to them, so a
link planted (or swapped in while the console looks) is a name that is not a folder, never a way
into another account's directory or the host's.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from slices.drivers.base import DriverError

CHECKPOINTS = "checkpoints"
INCOMPLETE = ".incomplete"
_STEP = re.compile(r"^step-(\d{1,12})$")
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SAFE_NAME = _SAFE  # an account's directory, a checkpoint run: one plain name
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
MAX_STEPS_READ = 100_000  # entries of one run's folder looked at (a folder of junk stays cheap)


@contextmanager
def _dir_at(parent: int | None, name: str | os.PathLike[str]) -> Iterator[int | None]:
    """A descriptor of the folder ``name`` (relative to ``parent``), or None when it is missing,
    not a folder, or a symlink (``O_NOFOLLOW``: ELOOP; never followed)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES):
            yield None
            return
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def _lstat(name: str, parent: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return None


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
        """The account's directory (and its checkpoints directory); idempotent. A ``checkpoints``
        the tenant replaced by a link or a file is left alone (made through nothing)."""
        path = self._account(owner)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            # The root is the operator's (it may be a link to the mount): followed. Below it,
            # nothing is.
            root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
            try:
                with suppress(FileExistsError):
                    os.mkdir(owner, 0o755, dir_fd=root)
                with _dir_at(root, owner) as account:
                    if account is None:
                        raise OSError(errno.ENOTDIR, f"{owner} is not a folder (or a symlink)")
                    with suppress(FileExistsError):
                        os.mkdir(CHECKPOINTS, 0o755, dir_fd=account)
            finally:
                os.close(root)
        except OSError as exc:
            raise DriverError("pfs_unavailable", f"{self.root}: {exc.strerror}") from exc
        return path

    def measure(self, owner: str) -> Usage:
        """Bytes and files under the account's directory (symlinks are counted, never followed:
        ``os.fwalk`` opens each folder relative to its parent's descriptor, without following)."""
        path = self._account(owner)
        total = files = 0
        with _dir_at(None, path) as top:
            if top is None:
                return Usage(0, 0)
        with suppress(OSError):  # the directory removed meanwhile: what was counted
            for _dirpath, dirs, names, dir_fd in os.fwalk(path, follow_symlinks=False):
                for name in (*names, *dirs):
                    st = _lstat(name, dir_fd)
                    if st is None or stat.S_ISDIR(st.st_mode):
                        continue  # a folder (walked next), or removed while walking
                    total += st.st_size  # a link counts as the link, never what it points to
                    files += 1
        return Usage(total, files)

    def latest_checkpoint(self, owner: str, run: str) -> Checkpoint | None:
        """The highest whole ``step-<N>`` of ``run`` (one with ``.incomplete`` is skipped).

        Only real folders count, reached without following a symlink at any step: a
        ``checkpoints``, ``<run>`` or ``step-<N>`` that is a link (to another account's
        checkpoints, to a host path) is not a checkpoint, and the time read is the folder's own."""
        if not _SAFE.match(run):
            return None
        best: tuple[int, str, float] | None = None
        with _chain(self._account(owner), CHECKPOINTS, run) as base:
            if base is None:
                return None
            with os.scandir(base) as entries:
                for n, entry in enumerate(entries):
                    if n >= MAX_STEPS_READ:
                        break
                    m = _STEP.match(entry.name)
                    if not m:
                        continue
                    st = _lstat(entry.name, base)
                    if st is None or not stat.S_ISDIR(st.st_mode):
                        continue  # a symlink, a file, or gone
                    step = int(m.group(1))
                    if best is not None and step <= best[0]:
                        continue
                    with _dir_at(base, entry.name) as folder:
                        if folder is None or _lstat(INCOMPLETE, folder) is not None:
                            continue
                        mtime = os.fstat(folder).st_mtime
                    best = (step, entry.name, mtime)
        if best is None:
            return None
        at = datetime.fromtimestamp(best[2], tz=UTC)
        return Checkpoint(run, best[0], f"/pfs/{CHECKPOINTS}/{run}/{best[1]}", at)


@contextmanager
def _chain(top: Path, *names: str) -> Iterator[int | None]:
    """A descriptor of ``top/names…``, each opened relative to the one before without following
    a symlink; None when any of them is missing, not a folder or a link."""
    with _dir_at(None, top) as fd:
        if fd is None or not names:
            yield fd
            return
        with _chain_at(fd, names) as inner:
            yield inner


@contextmanager
def _chain_at(parent: int, names: tuple[str, ...]) -> Iterator[int | None]:
    with _dir_at(parent, names[0]) as fd:
        if fd is None or len(names) == 1:
            yield fd
            return
        with _chain_at(fd, names[1:]) as inner:
            yield inner
