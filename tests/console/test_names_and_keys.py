"""Pasted keys and chosen names: one key per line, no control or invisible characters in names."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from console import services
from console.models import ApiToken, SshKey
from console.sshkeys import SshKeyError, parse_public_key
from tests.console.factories import ed25519_public_key, rsa_public_key

HOSTILE_NAMES = [
    "\x1b[31mred\x1b[0m",  # terminal escape
    "laptop\u202egpj.exe",  # right-to-left override
    "\u200b\u200b",  # zero-width spaces only
    "\u200d",  # zero-width joiner only
    "a\x00b",  # NUL
    "line\nbreak",
    "tab\there",
    "bom\ufeff",
]


def test_two_keys_on_one_line_are_refused() -> None:
    first = ed25519_public_key("me@laptop")
    second = ed25519_public_key("me@desktop")
    for text in (
        f"{first} {second}",
        f"{first.rsplit(' ', 1)[0]} {second}",
        f"{first}\t{rsa_public_key(2048)}",
    ):
        with pytest.raises(SshKeyError) as refused:
            parse_public_key(text)
        assert refused.value.code == "multiple_keys", text


def test_a_comment_may_mention_key_words_that_are_not_keys() -> None:
    key = parse_public_key(ed25519_public_key("work laptop (ssh-agent) 2026"))
    assert key.comment == "work laptop (ssh-agent) 2026"


@pytest.mark.django_db
def test_two_keys_on_one_line_get_a_message_on_the_page(alice_client: Client) -> None:
    text = f"{ed25519_public_key('a@x')} {ed25519_public_key('b@y')}"
    client = alice_client
    response = client.post(
        reverse("account:ssh-key-list"),
        {"public_key": text},
        headers={"Accept-Language": "en"},
    )
    assert response.status_code == 200
    assert "one key" in response.content.decode()
    assert not SshKey.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_key_and_token_names_with_control_or_invisible_characters_are_refused(
    alice, name: str
) -> None:  # noqa: ANN001
    with pytest.raises(ValidationError) as refused:
        services.add_ssh_key(alice, name=name, public_key=ed25519_public_key("x@y"))
    assert "name" in refused.value.error_dict
    with pytest.raises(ValidationError) as refused:
        services.create_api_token(alice, name=name)
    assert "name" in refused.value.error_dict
    assert not SshKey.objects.exists() and not ApiToken.objects.exists()


@pytest.mark.django_db
def test_the_api_refuses_hostile_names_with_the_error_body(alice_client: Client) -> None:
    for path, body in (
        ("/api/v1/api-tokens/", {"name": "ci\u202e"}),
        ("/api/v1/ssh-keys/", {"name": "\x1b[31m", "public_key": ed25519_public_key("x@y")}),
    ):
        response = alice_client.post(path, body, content_type="application/json")
        assert response.status_code == 400, (path, response.content)
        assert "name" in response.json()["fields"], response.json()


@pytest.mark.django_db
def test_names_in_any_script_with_ordinary_spaces_are_fine(alice) -> None:  # noqa: ANN001
    key = services.add_ssh_key(
        alice, name="实验室 服务器 – Ünïcode 🚀", public_key=ed25519_public_key("x@y")
    )
    token, _raw = services.create_api_token(alice, name="训练 流水线")
    assert key.name == "实验室 服务器 – Ünïcode 🚀" and token.name == "训练 流水线"
