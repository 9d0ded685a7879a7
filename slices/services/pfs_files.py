"""Your files on /pfs without SSH: list a folder, download, upload, make a folder, delete
(README "Storage and resilience", the /pfs file browser at /storage/pfs/).

The console reaches each account's PFS directory through its own mount (``storage.account_root``:
``SLICES_PFS_CONSOLE_ROOT``, else ``SLICES_PFS_ROOT``; the simulated fleet's ``var/sim-pfs``). What
a customer sends is a path *relative to their own directory*; nothing here ever builds a host path
string from it and opens that. Every operation walks from the account's directory one name at a
time through directory file descriptors opened with ``O_NOFOLLOW`` (``openat``), and acts on the
last name relative to its parent's descriptor. So:

- ``..``, an absolute path, a NUL, a name over 255 bytes or a path over 4,096 bytes is refused
  (400) before the file system is touched; an empty or ``.`` segment is dropped;
- a symlink anywhere on the way (one a job made on an instance, or one swapped in while a request
  runs) is never followed: it answers 404 like a name that is not there, and it is listed as a
  link, never opened; deleting one removes the link, not what it points to;
- only regular files are downloaded (a FIFO or a device is 404, and it is opened non-blocking and
  checked before a byte is read);
- an upload is written to a hidden ``.upload-<random>.part`` file in the target folder, then
  published under its name with one atomic call: a hard link (fails if the name exists, so nothing
  is overwritten unless asked) or, when asked to replace, a rename over the old file.

The core (``split_path``, ``check_name``, ``AccountFiles``, ``PendingUpload``) needs no database
and no settings: the tests drive it on a temporary directory. ``for_user``, ``upload_limit`` and
``quota_check`` at the end are the Django glue (settings, the account's quota, the usage figure).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from django.utils.translation import gettext_noop

from console.errors import DomainError, ErrorCode

MAX_NAME_BYTES = 255  # NAME_MAX of Linux file systems
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_DEPTH = 128
MAX_LISTED = 2000  # entries read from one folder (a bigger one is shown cut, and says so)
UPLOAD_PREFIX = ".upload-"
UPLOAD_SUFFIX = ".part"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC
# Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC
# Where a hard link cannot be made (some network file systems), publishing falls back to a rename
# after checking the name is free.
_NO_LINK = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS}
# A symlink met with O_NOFOLLOW (ELOOP; some systems say ENOTDIR or EMLINK), a missing name, a
# file where a folder was expected, no permission: all "not there" for the customer.
_NOT_THERE = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EMLINK, errno.EACCES, errno.EPERM}


class PfsRefused(DomainError):
    """A file operation refused, with the status the page answers (400, 404, 409, 413, 507)."""

    code = ErrorCode.INVALID
    http_status = 400


def bad_path() -> PfsRefused:
    return PfsRefused(gettext_noop("That is not a path in your /pfs."))


def not_found() -> PfsRefused:
    return PfsRefused(
        gettext_noop("There is no such file or folder in your /pfs."),
        code=ErrorCode.NOT_FOUND,
        http_status=404,
    )


def unavailable() -> PfsRefused:
    return PfsRefused(
        gettext_noop("The parallel file system cannot be reached right now; try again shortly."),
        code=ErrorCode.UNAVAILABLE,
        http_status=503,
    )


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def split_path(text: str) -> tuple[str, ...]:
    """A customer's relative path as its names (``()`` is the account's own directory).

    Refused (400): not text, a NUL, a leading ``/`` (an absolute path), a ``..`` segment, a name
    over 255 bytes, more than 4,096 bytes or 128 levels. Empty and ``.`` segments are dropped.
    """
    if not isinstance(text, str) or "\x00" in text or text.startswith("/"):
        raise bad_path()
    if _nbytes(text) > MAX_PATH_BYTES:
        raise bad_path()
    parts = tuple(p for p in text.split("/") if p not in ("", "."))
    if len(parts) > MAX_DEPTH or any(p == ".." or _nbytes(p) > MAX_NAME_BYTES for p in parts):
        raise bad_path()
    return parts


def join(parts: tuple[str, ...]) -> str:
    return "/".join(parts)


def check_name(name: str) -> str:
    """A name for a new file or folder: one name, no control characters, at most 255 bytes."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or _nbytes(name) > MAX_NAME_BYTES
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
    ):
        raise PfsRefused(
            gettext_noop(
                "Choose another name: one name (no “/”), without control characters, at most "
                "255 bytes, not “.” or “..”."
            ),
            field="name",
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_path() from None
    return name


@dataclass(frozen=True)
class Entry:
    """One name in a folder: ``kind`` is dir, file, link (never followed) or other."""

    name: str
    path: str  # relative to the account's directory, "/"-separated
    kind: str
    size: int
    modified: datetime
    addressable: bool = True  # False: a name that is not UTF-8 (reachable from an instance only)

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @property
    def pfs_path(self) -> str:
        """As a job sees it."""
        return f"/pfs/{self.path}"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _entry(parts: tuple[str, ...], name: str, st: os.stat_result) -> Entry:
    try:
        name.encode("utf-8")
        shown, addressable = name, True
    except UnicodeEncodeError:  # os.fsdecode's surrogates: bytes that are not UTF-8
        shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        addressable = False
    return Entry(
        name=shown,
        path=join((*parts, shown)),
        kind=_kind(st.st_mode),
        size=st.st_size if stat.S_ISREG(st.st_mode) else 0,
        modified=datetime.fromtimestamp(st.st_mtime, tz=UTC),
        addressable=addressable,
    )


@dataclass(frozen=True)
class Listing:
    path: str
    parts: tuple[str, ...]
    entries: list[Entry]
    truncated: bool  # more than MAX_LISTED names: the first ones read are shown

    @property
    def crumbs(self) -> list[tuple[str, str]]:
        """(name, path) from the account's directory down to this folder."""
        return [(name, join(self.parts[: i + 1])) for i, name in enumerate(self.parts)]

    @property
    def parent(self) -> str | None:
        return join(self.parts[:-1]) if self.parts else None

    @property
    def pfs_path(self) -> str:
        return "/pfs/" + self.path if self.path else "/pfs"


def _not_there(exc: OSError) -> PfsRefused:
    return not_found() if exc.errno in _NOT_THERE else unavailable()


def _open_dir_at(fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        raise _not_there(exc) from exc


class AccountFiles:
    """One account's directory on the console host's PFS mount."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _open_root(self) -> int:
        try:
            return os.open(self.root, _DIR_FLAGS)
        except FileNotFoundError:
            pass  # a new account: its directory is made on first use
        except OSError as exc:
            raise unavailable() from exc
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            return os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise unavailable() from exc

    @contextmanager
    def folder_fd(self, parts: tuple[str, ...]) -> Iterator[int]:
        """A descriptor of the folder ``parts``, reached one name at a time, never through a
        symlink (404 where one is met, or a name is missing or not a folder)."""
        fd = self._open_root()
        try:
            for name in parts:
                inner = _open_dir_at(fd, name)
                os.close(fd)
                fd = inner
            yield fd
        finally:
            os.close(fd)

    def folder(self, path: str) -> str:
        """``path`` normalised, once it is known to be a folder (400 or 404 otherwise)."""
        parts = split_path(path)
        with self.folder_fd(parts):
            pass
        return join(parts)

    # -- reading ------------------------------------------------------------------------------
    def listing(self, path: str) -> Listing:
        """The folder's names, folders first, then by name (case-insensitively)."""
        parts = split_path(path)
        entries: list[Entry] = []
        truncated = False
        with self.folder_fd(parts) as fd:
            try:
                with os.scandir(fd) as it:
                    for found in it:
                        if len(entries) >= MAX_LISTED:
                            truncated = True
                            break
                        try:
                            st = found.stat(follow_symlinks=False)
                        except OSError:
                            continue  # removed while listing
                        entries.append(_entry(parts, found.name, st))
            except OSError as exc:
                raise unavailable() from exc
        entries.sort(key=lambda e: (not e.is_dir, e.name.casefold(), e.name))
        return Listing(join(parts), parts, entries, truncated)

    def entry_at(self, path: str) -> Entry:
        """What is at ``path`` (not following a symlink); 404 when nothing is."""
        parts = split_path(path)
        if not parts:
            raise bad_path()
        with self.folder_fd(parts[:-1]) as fd:
            try:
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise _not_there(exc) from exc
        return _entry(parts[:-1], parts[-1], st)

    def open_file(self, path: str) -> tuple[IO[bytes], Entry]:
        """A regular file opened for reading, and what it is; 404 for anything else."""
        parts = split_path(path)
        if not parts:
            raise not_found()
        with self.folder_fd(parts[:-1]) as dir_fd:
            try:
                before = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
            except OSError as exc:
                raise _not_there(exc) from exc
            if not stat.S_ISREG(before.st_mode):
                raise not_found()  # a folder, a link, a FIFO, a device: never opened
            try:
                fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                raise _not_there(exc) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (
                before.st_dev,
                before.st_ino,
            ):
                raise not_found()  # swapped between the look and the open
            os.set_blocking(fd, True)
            handle = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        return handle, _entry(parts[:-1], parts[-1], st)

    # -- writing ------------------------------------------------------------------------------
    def make_folder(self, path: str, name: str) -> Entry:
        parts = split_path(path)
        name = check_name(name)
        with self.folder_fd(parts) as fd:
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                raise PfsRefused(
                    gettext_noop("%(name)s is already there."),
                    code=ErrorCode.CONFLICT,
                    http_status=409,
                    name=name,
                ) from None
            except OSError as exc:
                raise unavailable() from exc
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        return _entry(parts, name, st)

    def delete(self, path: str) -> Entry:
        """Delete a file (or a link: the link only) or an empty folder."""
        parts = split_path(path)
        if not parts:
            raise bad_path()  # the account's own directory
        name = parts[-1]
        with self.folder_fd(parts[:-1]) as fd:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise _not_there(exc) from exc
            entry = _entry(parts[:-1], name, st)
            try:
                if stat.S_ISDIR(st.st_mode):
                    os.rmdir(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise PfsRefused(
                        gettext_noop(
                            "The folder %(name)s is not empty: delete what is in it first."
                        ),
                        code=ErrorCode.CONFLICT,
                        http_status=409,
                        name=name,
                    ) from None
                raise _not_there(exc) from exc
        return entry

    def begin_upload(self, path: str) -> PendingUpload:
        """A hidden temporary file in the folder ``path``, to be published under a name."""
        return PendingUpload(self, split_path(path))


class PendingUpload:
    """An upload being written: ``write`` its bytes, then ``publish`` or ``abort`` (idempotent;
    the view aborts whatever was not published, so no temporary file is left behind)."""

    def __init__(self, files: AccountFiles, parts: tuple[str, ...]) -> None:
        self.parts = parts
        self.size = 0
        self.done = False
        self.temp = f"{UPLOAD_PREFIX}{secrets.token_hex(8)}{UPLOAD_SUFFIX}"
        # The folder stays open until the end: a folder renamed or replaced meanwhile does not
        # redirect the file elsewhere.
        with files.folder_fd(parts) as fd:
            self.dir_fd = os.dup(fd)
        try:
            handle = os.open(self.temp, _CREATE_FLAGS, 0o644, dir_fd=self.dir_fd)
        except OSError as exc:
            os.close(self.dir_fd)
            raise unavailable() from exc
        self.handle: IO[bytes] | None = os.fdopen(handle, "wb")

    def write(self, data: bytes) -> None:
        if self.handle is None:
            raise unavailable()
        self.handle.write(data)
        self.size += len(data)

    def _close(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            handle.close()

    def abort(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            self._close()
        finally:
            with suppress(OSError):
                os.unlink(self.temp, dir_fd=self.dir_fd)
            os.close(self.dir_fd)

    def publish(self, name: str, *, overwrite: bool, fits: Callable[[int], bool]) -> Entry:
        """Give the file its name: refused (409) when the name is taken and ``overwrite`` is not
        asked or names a folder, and (507) when ``fits(bytes replaced)`` says the account's /pfs
        would be over its quota. Aborted on any refusal."""
        if self.done:
            raise unavailable()
        try:
            name = check_name(name)
            assert self.handle is not None
            self.handle.flush()
            os.fsync(self.handle.fileno())  # whole on disk before it has a name
            self._close()
            existing = self._existing(name)
            if existing is not None and (stat.S_ISDIR(existing.st_mode) or not overwrite):
                raise self._taken(name, folder=stat.S_ISDIR(existing.st_mode))
            replaced = existing.st_size if existing and stat.S_ISREG(existing.st_mode) else 0
            if not fits(replaced):
                raise PfsRefused(
                    gettext_noop(
                        "Not uploaded: %(name)s would take your /pfs over its quota. Delete files "
                        "first."
                    ),
                    code=ErrorCode.QUOTA_EXCEEDED,
                    http_status=507,
                    name=name,
                )
            self._rename_or_link(name, overwrite=overwrite)
            st = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except BaseException:
            self.abort()
            raise
        self.done = True
        os.close(self.dir_fd)
        return _entry(self.parts, name, st)

    def _existing(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _taken(self, name: str, *, folder: bool) -> PfsRefused:
        template = (
            gettext_noop("A folder named %(name)s is already there.")
            if folder
            else gettext_noop("%(name)s is already there: tick “Replace” to overwrite it.")
        )
        return PfsRefused(template, code=ErrorCode.CONFLICT, http_status=409, name=name)

    def _rename_or_link(self, name: str, *, overwrite: bool) -> None:
        fd = self.dir_fd
        if overwrite:
            os.rename(self.temp, name, src_dir_fd=fd, dst_dir_fd=fd)  # atomic replacement
            return
        try:
            os.link(self.temp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        except FileExistsError:
            raise self._taken(name, folder=False) from None
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            if self._existing(name) is not None:
                raise self._taken(name, folder=False) from None
            os.rename(self.temp, name, src_dir_fd=fd, dst_dir_fd=fd)
            return
        os.unlink(self.temp, dir_fd=fd)


# ---------------------------------------------------------------------------------------------
# The Django side: whose directory, the size limit, the quota
# ---------------------------------------------------------------------------------------------


def for_user(user: Any) -> AccountFiles:
    """The requesting account's own directory: the only one a request ever reaches."""
    from slices.services import storage

    return AccountFiles(storage.account_root(user))


def upload_limit() -> int:
    from django.conf import settings

    return int(settings.SLICES_PFS_UPLOAD_MAX_BYTES)


def quota_check(user: Any) -> Callable[[int], bool]:
    """``fits(replaced)``: measures the account's directory now (the upload's temporary file, and
    any other upload in flight, included) and keeps the figure for the pages."""
    from slices.drivers import DriverError
    from slices.services import storage

    def fits(replaced: int) -> bool:
        try:
            usage = storage.pfs().measure(storage.account_dir(user))
        except DriverError:
            return False
        summary = storage.remember_usage(user, usage)
        return usage.bytes - replaced <= summary.quota_gb * storage.GB

    return fits


def too_large(limit: int) -> PfsRefused:
    return PfsRefused(
        gettext_noop(
            "Not uploaded: files up to %(limit)s can be uploaded here; use an instance "
            "for bigger ones."
        ),
        code=ErrorCode.TOO_LARGE,
        http_status=413,
        limit=_size_text(limit),
    )


def over_quota(used: int, quota_gb: int) -> PfsRefused:
    return PfsRefused(
        gettext_noop(
            "Not uploaded: your /pfs holds %(used)s of its %(quota)s GB quota and the file would "
            "not fit. Delete files first."
        ),
        code=ErrorCode.QUOTA_EXCEEDED,
        http_status=507,
        used=_size_text(used),
        quota=quota_gb,
    )


def _size_text(n: int) -> str:
    """Bytes in the largest binary unit that keeps a whole part (the messages' figures)."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def root_listing(user: Any) -> Listing | None:
    """The account's top folder for the storage page's /pfs card (None when it cannot be read)."""
    try:
        return for_user(user).listing("")
    except PfsRefused:
        return None
