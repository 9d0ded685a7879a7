"""The /pfs file browser's pages (README "Storage and resilience"): thin views over
``slices.services.pfs_files``, which does every file operation under the requesting account's own
directory. No URL names another account or a host path: ``?path=`` (or the form's ``path``) is
always relative to the requester's /pfs, so another customer's files answer 404 like files that do
not exist, and an anonymous visitor is sent to log in.

- ``GET /storage/pfs/?path=a/b``: the folder (folders first, breadcrumbs, sizes, times);
- ``GET /storage/pfs/download/?path=a/b/f``: the file, streamed, as an attachment;
- ``POST /storage/pfs/upload/?path=a/b`` (multipart ``file``, ``overwrite``): written straight into a
  temporary file in that folder, then published atomically; ``SLICES_PFS_UPLOAD_MAX_BYTES`` and
  the account's quota are checked before a byte is stored and again before it is published;
- ``POST /storage/pfs/mkdir/`` (``path``, ``name``); ``GET``/``POST /storage/pfs/delete/`` (the GET
  asks for confirmation, the POST deletes a file or an empty folder).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import IO, Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.core.handlers.asgi import ASGIRequest
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.http import content_disposition_header
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from console.tenancy import acting
from slices.services import pfs_files, storage
from slices.services.pfs_files import AccountFiles, PendingUpload, PfsRefused

CHUNK_SIZE = 256 * 1024
# A multipart body carries its boundaries and the form's small fields besides the file.
MULTIPART_SLACK = 64 * 1024


def browse_url(path: str = "") -> str:
    base = reverse("slices:pfs-browse")
    return f"{base}?{urlencode({'path': path})}" if path else base


def _page(
    request: HttpRequest,
    files: AccountFiles,
    path: str,
    *,
    error: PfsRefused | None = None,
) -> HttpResponse:
    """The folder ``path`` (or, when it cannot be listed, the refusal alone) with ``error``."""
    listing = None
    try:
        listing = files.listing(path)
    except PfsRefused as exc:
        error = error or exc
    context = {
        "listing": listing,
        "error": error,
        "pfs": storage.fresh_pfs_summary(acting(request)),
        "upload_limit": pfs_files.upload_limit(),
    }
    status = error.http_status if error is not None else 200
    return render(request, "slices/pfs_browser.html", context, status=status)


@login_required
@require_safe
def pfs_browse(request: HttpRequest) -> HttpResponse:
    return _page(request, pfs_files.for_user(acting(request)), request.GET.get("path", ""))


async def _chunks(handle: IO[bytes]) -> AsyncIterator[bytes]:
    """The file as an asynchronous iterator for Django's ASGI handler (which would otherwise read
    a plain file whole into memory); each read runs in a thread, off the event loop."""
    try:
        while chunk := await asyncio.to_thread(handle.read, CHUNK_SIZE):
            yield chunk
    finally:
        handle.close()


@login_required
@require_safe
def pfs_download(request: HttpRequest) -> HttpResponseBase:
    files = pfs_files.for_user(acting(request))
    path = request.GET.get("path", "")
    try:
        handle, entry = files.open_file(path)
    except PfsRefused as exc:
        return _page(request, files, _parent_of(path), error=exc)
    response: HttpResponseBase
    if isinstance(request, ASGIRequest):
        response = StreamingHttpResponse(_chunks(handle), content_type="application/octet-stream")
        # Closed with the response too: a client gone before the first read never starts it.
        response._resource_closers.append(handle.close)  # type: ignore[attr-defined]
    else:
        response = FileResponse(handle, content_type="application/octet-stream")
        response.block_size = CHUNK_SIZE
    # Always an attachment, always octet-stream: a customer's HTML is never rendered on the
    # console's origin. The name is quoted (RFC 6266; non-ASCII as filename*).
    response["Content-Disposition"] = content_disposition_header(True, entry.name)
    response["Content-Length"] = str(entry.size)
    response["X-Content-Type-Options"] = "nosniff"
    return response


class PfsUploadHandler(FileUploadHandler):
    """The form's first ``file`` goes straight into a temporary file in the target folder on the
    PFS (not into /tmp first, then copied); reading stops at the size limit."""

    def __init__(self, files: AccountFiles, folder: str, limit: int) -> None:
        super().__init__()
        self.files = files
        self.folder = folder
        self.limit = limit
        self.upload: PendingUpload | None = None
        self.refused: PfsRefused | None = None
        self.active = False  # the part being read is the file we keep
        self.completed = False

    def new_file(self, field_name: str, file_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, file_name, *args, **kwargs)
        self.active = False
        if field_name != "file" or self.upload is not None or self.refused is not None:
            return  # one file per request: others are read past, not kept
        try:
            self.upload = self.files.begin_upload(self.folder)
        except PfsRefused as exc:
            self.refused = exc
            return
        self.active = True

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        if not self.active or self.upload is None:
            return None
        if self.upload.size + len(raw_data) > self.limit:
            self.refused = pfs_files.too_large(self.limit)
            self.upload.abort()
            self.active = False
            raise StopUpload(connection_reset=True)
        try:
            self.upload.write(raw_data)
        except OSError:
            self.refused = pfs_files.unavailable()
            self.upload.abort()
            self.active = False
            raise StopUpload(connection_reset=True) from None
        return None

    def file_complete(self, file_size: int) -> None:
        if self.active:
            self.completed = True
            self.active = False
        return None  # the handler holds the result; nothing goes into request.FILES

    def upload_interrupted(self) -> None:
        self.abort()

    def abort(self) -> None:
        if self.upload is not None:
            self.upload.abort()


def _content_length(request: HttpRequest) -> int:
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


@csrf_exempt  # checked below, after the upload handler is in place (Django's documented way)
@login_required
@require_POST
def pfs_upload(request: HttpRequest) -> HttpResponse:
    """Refuses an oversized body from its Content-Length, before reading it; otherwise reads the
    form through ``PfsUploadHandler`` and checks CSRF as any other form."""
    files = pfs_files.for_user(acting(request))
    folder = request.GET.get("path", "")
    limit = pfs_files.upload_limit()
    length = _content_length(request)
    try:
        folder = files.folder(folder)  # it exists and is a folder (404/400 otherwise)
        if length > limit + MULTIPART_SLACK:
            raise pfs_files.too_large(limit)
        summary = storage.fresh_pfs_summary(acting(request))
        if summary.used_bytes + max(0, length - MULTIPART_SLACK) > summary.quota_gb * storage.GB:
            raise pfs_files.over_quota(summary.used_bytes, summary.quota_gb)
    except PfsRefused as exc:
        return _page(request, files, folder, error=exc)
    handler = PfsUploadHandler(files, folder, limit)
    request.upload_handlers = [handler]
    try:
        return _upload(request, files, folder, handler)
    finally:
        handler.abort()  # nothing once published; otherwise no temporary file is left behind


@csrf_protect
def _upload(
    request: HttpRequest, files: AccountFiles, folder: str, handler: PfsUploadHandler
) -> HttpResponse:
    overwrite = request.POST.get("overwrite") in ("on", "1", "true")  # reads the body
    upload = handler.upload
    try:
        if handler.refused is not None:
            raise handler.refused
        if upload is None or not handler.completed:
            raise PfsRefused(gettext_noop("Choose a file to upload."), field="file")
        entry = upload.publish(
            handler.file_name or "",
            overwrite=overwrite,
            fits=pfs_files.quota_check(acting(request)),
        )
    except PfsRefused as exc:
        return _page(request, files, folder, error=exc)
    messages.success(
        request,
        _("Uploaded %(path)s (%(size)s).")
        % {"path": entry.pfs_path, "size": filesizeformat(entry.size)},
    )
    return redirect(browse_url(folder))


@login_required
@require_POST
def pfs_mkdir(request: HttpRequest) -> HttpResponse:
    files = pfs_files.for_user(acting(request))
    folder = request.POST.get("path", "")
    try:
        entry = files.make_folder(folder, request.POST.get("name", ""))
    except PfsRefused as exc:
        return _page(request, files, folder, error=exc)
    messages.success(request, _("Made the folder %(path)s.") % {"path": entry.pfs_path})
    return redirect(browse_url(folder))


@login_required
@require_http_methods(["GET", "POST"])
def pfs_delete(request: HttpRequest) -> HttpResponse:
    """GET asks for confirmation (the page works without JavaScript); POST deletes."""
    files = pfs_files.for_user(acting(request))
    data = request.POST if request.method == "POST" else request.GET
    path = data.get("path", "")
    try:
        if request.method == "GET":
            entry = files.entry_at(path)
            return render(
                request,
                "slices/pfs_delete.html",
                {"entry": entry, "back": browse_url(entry.path.rpartition("/")[0])},
            )
        entry = files.delete(path)
    except PfsRefused as exc:
        parts = _parent_of(path)
        return _page(request, files, parts, error=exc)
    storage.measure_pfs(acting(request))
    messages.success(request, _("Deleted %(path)s.") % {"path": entry.pfs_path})
    return redirect(browse_url(entry.path.rpartition("/")[0]))


def _parent_of(path: str) -> str:
    """The folder to show beside a refusal: the path's parent when it is a path at all."""
    try:
        return pfs_files.join(pfs_files.split_path(path)[:-1])
    except PfsRefused:
        return ""
