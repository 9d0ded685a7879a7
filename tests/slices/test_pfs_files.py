"""The /pfs file browser (issue 21, "Your files without SSH"): list, download (streamed), upload
(size limit, quota, no overwrite unless asked), make a folder, delete; always under the requesting
account's own directory: traversal, symlinks and other accounts answer 400/404 and change nothing.

The browser's routes carry no object id (the path is relative to the requester's own /pfs), so
tests/console/test_tenant_isolation.py's registry does not list them (it accepts only routes with
an id); ``test_another_customer_gets_404_on_every_method`` below applies its rule to them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import AsyncRequestFactory, Client
from django.urls import reverse

from slices import pfs_views
from slices.models import PfsUsage
from slices.services import pfs_files, storage
from slices.services.pfs_files import AccountFiles, PfsRefused, split_path

pytestmark = pytest.mark.django_db

BROWSE = "/storage/pfs/"
DOWNLOAD = "/storage/pfs/download/"
UPLOAD = "/storage/pfs/upload/"
MKDIR = "/storage/pfs/mkdir/"
DELETE = "/storage/pfs/delete/"


@pytest.fixture
def pfs(settings, tmp_path: Path) -> Path:
    """The console's view of the PFS in ``tmp_path``; returned."""
    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    return tmp_path / "pfs"


@pytest.fixture
def home(pfs: Path, alice) -> Path:  # noqa: ANN001
    """Alice's /pfs with a folder, a file in it, a top-level file and a checkpoints folder."""
    root = pfs / storage.account_dir(alice)
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.jsonl").write_bytes(b'{"q": 1}\n' * 100)
    (root / "checkpoints").mkdir()
    (root / "notes.txt").write_text("hello /pfs\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the PFS with a secret: nothing may read, list or change it."""
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "secret.txt").write_text("not yours")
    return secret


def snapshot(*roots: Path) -> dict[str, bytes | None]:
    """Every path under ``roots`` and the bytes of its files (links and folders: None)."""
    seen: dict[str, bytes | None] = {}
    for root in roots:
        for dirpath, dirs, names in os.walk(root):
            for name in dirs + names:
                path = Path(dirpath) / name
                seen[str(path)] = (
                    path.read_bytes() if path.is_file() and not path.is_symlink() else None
                )
    return seen


def q(path: str) -> dict[str, str]:
    return {"path": path}


# --- the path rules, without Django ----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "..",
        "../x",
        "a/../../x",
        "a/..",
        "/etc/passwd",
        "/pfs/data",
        "x\x00y",
        "a" * 256,
        "a/" * 2100,
    ],
)
def test_paths_outside_the_account_are_refused_before_touching_the_disk(text: str) -> None:
    with pytest.raises(PfsRefused) as info:
        split_path(text)
    assert info.value.http_status == 400


def test_empty_and_dot_segments_are_dropped() -> None:
    assert split_path("") == ()
    assert split_path("./a//b/.") == ("a", "b")
    assert split_path("%2e%2e") == ("%2e%2e",)  # a name, not a parent: decoded once by Django


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x\x01y", "tab\there", "é" * 128])
def test_bad_new_names_are_refused(name: str) -> None:
    with pytest.raises(PfsRefused):
        pfs_files.check_name(name)


def test_the_core_lists_folders_first_and_never_follows_a_link(tmp_path: Path, outside) -> None:  # noqa: ANN001
    root = tmp_path / "acct"
    (root / "b-dir").mkdir(parents=True)
    (root / "A-file").write_text("x")
    (root / "c-file").write_text("yy")
    (root / "z-dir").mkdir()
    (root / "escape").symlink_to(outside)
    files = AccountFiles(root)
    listing = files.listing("")
    assert [(e.name, e.kind) for e in listing.entries] == [
        ("b-dir", "dir"),
        ("z-dir", "dir"),
        ("A-file", "file"),
        ("c-file", "file"),
        ("escape", "link"),
    ]
    for attempt in (lambda: files.listing("escape"), lambda: files.open_file("escape/secret.txt")):
        with pytest.raises(PfsRefused) as info:
            attempt()
        assert info.value.http_status == 404


def test_a_fifo_is_never_opened_for_download(tmp_path: Path) -> None:
    root = tmp_path / "acct"
    root.mkdir()
    os.mkfifo(root / "pipe")
    with pytest.raises(PfsRefused) as info:
        AccountFiles(root).open_file("pipe")  # would block forever if it were opened
    assert info.value.http_status == 404


# --- the pages --------------------------------------------------------------------------------


def test_the_folder_page_lists_folders_first_with_sizes_and_breadcrumbs(home, alice_client) -> None:  # noqa: ANN001
    html = alice_client.get(BROWSE).content.decode().replace("\xa0", " ")
    assert html.index("checkpoints/") < html.index("data/") < html.index("notes.txt")
    assert "11 字节" in html  # notes.txt's size, in the page's language (zh-hans by default)
    page = alice_client.get(BROWSE, q("data"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="pfs-crumbs"' in html and "/pfs/data" in html
    assert f'href="{DOWNLOAD}?path=data/train.jsonl"' in html
    assert 'id="pfs-upload"' in html and 'enctype="multipart/form-data"' in html


def test_the_storage_page_leads_to_the_browser(home, alice_client) -> None:  # noqa: ANN001
    html = alice_client.get(reverse("slices:disk-list")).content.decode()
    assert 'id="pfs-browse-link"' in html and f'href="{BROWSE}"' in html
    assert f'href="{BROWSE}?path=data"' in html  # the top folder, listed on the card
    assert 'id="pfs-usage-figure"' in html


def test_a_download_is_streamed_as_an_attachment_and_matches(home, alice_client) -> None:  # noqa: ANN001
    payload = os.urandom(700_000)  # several chunks
    (home / "data" / "weights.bin").write_bytes(payload)
    response = alice_client.get(DOWNLOAD, q("data/weights.bin"))
    assert response.status_code == 200
    assert response.streaming  # never read whole into memory
    assert b"".join(response.streaming_content) == payload
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"] == 'attachment; filename="weights.bin"'
    assert response["Content-Length"] == str(len(payload))


def test_a_download_name_is_quoted_safely(home, alice_client) -> None:  # noqa: ANN001
    (home / '适配器 "v1".txt').write_text("x")
    (home / "evil\r\nSet-Cookie: a=b").write_text("y")
    response = alice_client.get(DOWNLOAD, q('适配器 "v1".txt'))
    assert response["Content-Disposition"].startswith("attachment; filename*=utf-8''")
    assert "%E9%80%82" in response["Content-Disposition"]
    response = alice_client.get(DOWNLOAD, q("evil\r\nSet-Cookie: a=b"))
    assert response.status_code == 200
    assert "\r" not in response["Content-Disposition"] and "Set-Cookie" not in response.headers


def test_under_asgi_the_download_is_an_async_stream(home, alice) -> None:  # noqa: ANN001
    payload = os.urandom(600_000)
    (home / "big.bin").write_bytes(payload)
    request = AsyncRequestFactory().get(DOWNLOAD, q("big.bin"))
    request.user = alice
    response = pfs_views.pfs_download(request)
    assert response.is_async  # Django's ASGI handler would read a sync file whole

    async def consume() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    assert async_to_sync(consume)() == payload


def _upload(client: Client, folder: str, name: str, data: bytes, **extra: str):  # noqa: ANN202
    url = f"{UPLOAD}?path={folder}" if folder else UPLOAD
    return client.post(url, {"file": SimpleUploadedFile(name, data), **extra})


def test_upload_writes_the_file_and_leaves_no_temporary(home, alice, alice_client) -> None:  # noqa: ANN001
    response = _upload(alice_client, "data", "new.csv", b"a,b\n1,2\n")
    assert response.status_code == 302 and response["Location"] == f"{BROWSE}?path=data"
    assert (home / "data" / "new.csv").read_bytes() == b"a,b\n1,2\n"
    assert not [p for p in (home / "data").iterdir() if p.name.startswith(".upload-")]
    assert PfsUsage.objects.get(team=alice.personal_team).used_bytes >= 8  # the figure was kept
    html = alice_client.get(f"{BROWSE}?path=data").content.decode()
    assert "new.csv" in html


def test_upload_refuses_to_overwrite_unless_asked(home, alice_client) -> None:  # noqa: ANN001
    response = _upload(alice_client, "", "notes.txt", b"replaced")
    assert response.status_code == 409
    assert (home / "notes.txt").read_text() == "hello /pfs\n"
    assert 'id="pfs-error"' in response.content.decode()
    response = _upload(alice_client, "", "data", b"not a folder")  # a folder's name
    assert response.status_code == 409 and (home / "data").is_dir()
    response = _upload(alice_client, "", "notes.txt", b"replaced", overwrite="on")
    assert response.status_code == 302
    assert (home / "notes.txt").read_bytes() == b"replaced"
    assert not [p for p in home.iterdir() if p.name.startswith(".upload-")]


def test_upload_over_the_size_limit_is_refused_and_leaves_nothing(
    home, alice_client, settings
) -> None:  # noqa: ANN001
    settings.SLICES_PFS_UPLOAD_MAX_BYTES = 1000
    before = snapshot(home)
    # Within the multipart slack: refused while reading, at the limit.
    response = _upload(alice_client, "data", "big.bin", b"x" * 5000)
    assert response.status_code == 413
    # Far over: refused from Content-Length before the body is read.
    response = _upload(alice_client, "data", "huge.bin", b"x" * 200_000)
    assert response.status_code == 413
    assert "KB" in response.content.decode() or "1000" in response.content.decode()
    assert snapshot(home) == before


def test_upload_over_the_quota_is_refused_with_a_clear_message(home, alice, alice_client) -> None:  # noqa: ANN001
    PfsUsage.objects.create(team=alice.personal_team, quota_gb=1)
    with open(home / "dataset.bin", "wb") as handle:  # sparse: 1 GiB less 100 bytes
        handle.truncate(1024**3 - 100)
    storage.measure_pfs(alice)
    before = snapshot(home)
    response = _upload(alice_client, "", "small.txt", b"y" * 1000)  # checked before publishing
    assert response.status_code == 507
    assert "quota" in response.content.decode() or "配额" in response.content.decode()
    response = _upload(alice_client, "", "mid.bin", b"y" * 300_000)  # refused before reading
    assert response.status_code == 507
    assert snapshot(home) == before


def test_upload_checks_csrf_and_leaves_no_temporary(home, alice) -> None:  # noqa: ANN001
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    before = snapshot(home)
    response = _upload(client, "data", "x.txt", b"data")
    assert response.status_code == 403
    assert snapshot(home) == before


def test_upload_without_a_file_says_so(home, alice_client) -> None:  # noqa: ANN001
    response = alice_client.post(UPLOAD, {"overwrite": "on"})
    assert response.status_code == 400 and 'id="pfs-error"' in response.content.decode()


def test_make_a_folder(home, alice_client) -> None:  # noqa: ANN001
    response = alice_client.post(MKDIR, {"path": "data", "name": "runs"})
    assert response.status_code == 302 and (home / "data" / "runs").is_dir()
    assert alice_client.post(MKDIR, {"path": "data", "name": "runs"}).status_code == 409
    for bad in ("a/b", "..", "x\x01"):
        assert alice_client.post(MKDIR, {"path": "", "name": bad}).status_code == 400


def test_delete_asks_first_then_deletes_a_file_or_an_empty_folder(home, alice_client) -> None:  # noqa: ANN001
    page = alice_client.get(DELETE, q("notes.txt"))
    assert page.status_code == 200 and 'id="pfs-delete-confirm"' in page.content.decode()
    assert (home / "notes.txt").exists()  # asking deletes nothing
    response = alice_client.post(DELETE, {"path": "notes.txt"})
    assert response.status_code == 302 and not (home / "notes.txt").exists()
    response = alice_client.post(DELETE, {"path": "data"})  # not empty
    assert response.status_code == 409 and (home / "data" / "train.jsonl").exists()
    assert alice_client.post(DELETE, {"path": "checkpoints"}).status_code == 302
    assert not (home / "checkpoints").exists()
    assert alice_client.post(DELETE, {"path": ""}).status_code == 400  # the /pfs itself
    assert alice_client.get(DELETE, q("missing.txt")).status_code == 404


# --- traversal and symlinks -------------------------------------------------------------------

TRAVERSALS = [
    "../",
    "..",
    "../outside/secret.txt",
    "data/../../outside/secret.txt",
    "/etc/passwd",
    "x\x00y",
    "n" * 300,
]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_traversal_is_refused_on_every_route_and_changes_nothing(
    path: str, home, outside, alice_client
) -> None:  # noqa: ANN001
    before = snapshot(home, outside)
    assert alice_client.get(BROWSE, q(path)).status_code == 400
    assert alice_client.get(DOWNLOAD, q(path)).status_code == 400
    assert alice_client.get(DELETE, q(path)).status_code == 400
    assert alice_client.post(DELETE, {"path": path}).status_code == 400
    assert alice_client.post(MKDIR, {"path": path, "name": "x"}).status_code == 400
    assert _upload(alice_client, path.replace("\x00", "%00"), "x.txt", b"x").status_code in (
        400,
        404,
    )
    assert snapshot(home, outside) == before


def test_encoded_traversal_is_decoded_once_and_refused(home, outside, alice_client) -> None:  # noqa: ANN001
    before = snapshot(home, outside)
    # %2e%2e%2f is "../" once Django decodes the query string: refused.
    assert alice_client.get(f"{DOWNLOAD}?path=%2e%2e%2foutside%2fsecret.txt").status_code == 400
    assert alice_client.get(f"{BROWSE}?path=%2E%2E").status_code == 400
    assert alice_client.get(f"{DOWNLOAD}?path=%00").status_code == 400
    # Twice encoded: a literal name "%2e%2e" that is not there.
    assert alice_client.get(f"{BROWSE}?path=%252e%252e%252f").status_code == 404
    assert snapshot(home, outside) == before


def test_a_symlink_pointing_outside_is_never_followed(home, outside, alice_client) -> None:  # noqa: ANN001
    (home / "escape").symlink_to(outside)
    (home / "secret-link").symlink_to(outside / "secret.txt")
    (home / "data" / "up").symlink_to("../..")
    before = snapshot(home, outside)
    html = alice_client.get(BROWSE).content.decode()
    assert "escape" in html and 'data-kind="link"' in html
    assert f"{DOWNLOAD}?path=secret-link" not in html  # listed, never offered for download
    assert alice_client.get(BROWSE, q("escape")).status_code == 404
    assert alice_client.get(BROWSE, q("data/up")).status_code == 404
    assert alice_client.get(DOWNLOAD, q("escape/secret.txt")).status_code == 404
    assert alice_client.get(DOWNLOAD, q("secret-link")).status_code == 404
    assert alice_client.get(DOWNLOAD, q("data/up/pfs")).status_code == 404
    assert _upload(alice_client, "escape", "planted.txt", b"x").status_code == 404
    assert alice_client.post(MKDIR, {"path": "escape", "name": "planted"}).status_code == 404
    assert alice_client.post(DELETE, {"path": "escape/secret.txt"}).status_code == 404
    assert snapshot(home, outside) == before
    # Deleting the link removes the link, never what it points to.
    assert alice_client.post(DELETE, {"path": "secret-link"}).status_code == 302
    assert (outside / "secret.txt").read_text() == "not yours"


# --- other accounts ---------------------------------------------------------------------------


def test_another_customer_cannot_see_download_or_delete(home, bob_client, client) -> None:  # noqa: ANN001
    before = snapshot(home)
    assert bob_client.get(BROWSE, q("data")).status_code == 404
    assert bob_client.get(DOWNLOAD, q("data/train.jsonl")).status_code == 404
    assert bob_client.get(DOWNLOAD, q("notes.txt")).status_code == 404
    assert bob_client.get(DELETE, q("notes.txt")).status_code == 404
    assert bob_client.post(DELETE, {"path": "notes.txt"}).status_code == 404
    assert bob_client.post(MKDIR, {"path": "data", "name": "x"}).status_code == 404
    assert _upload(bob_client, "data", "x.txt", b"x").status_code == 404
    assert "train.jsonl" not in bob_client.get(BROWSE).content.decode()
    assert snapshot(home) == before
    for url in (BROWSE, DOWNLOAD, UPLOAD, MKDIR, DELETE):  # anonymous: sent to log in
        assert client.get(url, q("notes.txt")).status_code in (302, 405)
        assert client.post(url, {"path": "notes.txt"}).status_code == 302


@pytest.mark.parametrize(
    ("url", "path"),
    [
        (BROWSE, "data"),
        (DOWNLOAD, "data/train.jsonl"),
        (UPLOAD, "data"),
        (MKDIR, "data"),
        (DELETE, "notes.txt"),
    ],
)
def test_another_customer_gets_404_on_every_method(url: str, path: str, home, bob_client) -> None:  # noqa: ANN001
    """tests/console/test_tenant_isolation.py's rule for these routes: 404 (or 405 where the method
    is not taken), never 403, and the owner's file untouched."""
    before = snapshot(home)
    target = f"{url}?path={path}"
    statuses = {
        method: getattr(bob_client, method)(target, data={"path": path, "name": "x"}).status_code
        for method in ("get", "post")
    }
    for method in ("put", "patch", "delete"):
        statuses[method] = getattr(bob_client, method)(target).status_code
    assert set(statuses.values()) <= {404, 405}, statuses
    assert 404 in statuses.values(), statuses
    assert snapshot(home) == before
