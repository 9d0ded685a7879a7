"""An order's references and names, through the API: a bad one is a 400 naming the field.

``image``, ``ssh_key`` and ``disks`` that name nothing the customer may use answer like a field
error of the serializer (``{"error": "invalid", "fields": {"<field>": [...]}}``; unknown assets
keep their ``unknown_asset`` code and name the field the same way), never a 404 that a script
cannot tell from a wrong URL. ``image`` is a version's slug or id, or a family's slug (its newest
version for the card, stated in the answer). Names of instances and disks follow the rules every
customer-chosen name follows (console/names.py).
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from billing.models import UsageSession
from console import services as console_services
from marketplace.models import ImageVersion
from slices.models import Disk, Instance
from slices.services import disks as disk_service
from slices.services.disks import DiskRefused
from tests.console.factories import ed25519_public_key
from tests.marketplace.factories import ImageFactory, ImageVersionFactory

pytestmark = pytest.mark.django_db
URL = "/api/v1/instances/"
ORDER = {"gpu_model": "RTX4090", "cards": 1}

# Invisible or text-reordering characters, and controls: refused in every name.
HOSTILE = [
    "gpu\u202egpj.exe",  # right-to-left override
    "a\u200bb",  # zero-width space
    "a\u200db",  # zero-width joiner
    "\ufeffbom",  # byte order mark
    "\u2066iso\u2069",  # bidi isolates
    "red\x1b[31m",  # terminal escape
    "line\nbreak",
    "para\u2029graph",  # paragraph separator
    "private\ue000",  # private use
]


def _api(user) -> APIClient:
    client = APIClient(HTTP_ACCEPT_LANGUAGE="en")
    client.force_authenticate(user)
    return client


@pytest.fixture
def pytorch(db) -> dict[str, ImageVersion]:
    """A family "pytorch": its newest version for RTX 4090 is 2.4.1 (2.10.0 is A800-only, 2.12.0
    is unlisted); the catalogue's order (position) is not the versions' order."""
    family = ImageFactory(slug="pytorch", name="PyTorch")
    versions = {
        "2.1.2": ImageVersionFactory(
            image=family, slug="pt-2.1.2", framework_version="2.1.2", position=0, recommended=True
        ),
        "2.4.1": ImageVersionFactory(
            image=family, slug="pt-2.4.1", framework_version="2.4.1", position=2
        ),
        "2.3.1": ImageVersionFactory(
            image=family, slug="pt-2.3.1", framework_version="2.3.1", position=1
        ),
        "2.10.0": ImageVersionFactory(
            image=family,
            slug="pt-2.10.0",
            framework_version="2.10.0",
            position=3,
            gpu_models=["A800"],
        ),
        "2.12.0": ImageVersionFactory(
            image=family, slug="pt-2.12.0", framework_version="2.12.0", position=4, is_listed=False
        ),
    }
    ImageFactory(slug="empty", name="Empty")  # no versions at all: nothing for any card
    return versions


def _assert_field_error(response, field: str, code: str = "invalid") -> dict:
    assert response.status_code == 400, (response.status_code, response.content)
    body = response.json()
    assert body["error"] == code, body
    assert list(body["fields"]) == [field], body
    assert body["fields"][field] == [body["detail"]], body
    return body


# --- bad references ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "image",
    ["no-such-image", pytest.param(str(uuid.uuid4()), id="random-uuid"), "empty", "PYTORCH "],
)
def test_an_unknown_image_is_a_400_naming_the_field(sim_fleet, funded, pytorch, image) -> None:
    response = _api(funded).post(URL, {**ORDER, "image": image}, format="json")
    body = _assert_field_error(response, "image")
    assert "image" in body["detail"].lower()
    assert not Instance.objects.exists() and not UsageSession.objects.exists()


def test_an_image_for_another_card_is_a_400_naming_the_field(sim_fleet, funded, pytorch) -> None:
    response = _api(funded).post(URL, {**ORDER, "image": "pt-2.10.0"}, format="json")
    body = _assert_field_error(response, "image")
    assert "RTX4090" in body["detail"]
    assert not Instance.objects.exists()


def test_an_unknown_or_foreign_ssh_key_is_a_400_naming_the_field(sim_fleet, funded, bob) -> None:
    bobs = console_services.add_ssh_key(bob, name="bob", public_key=ed25519_public_key("b@x"))
    answers = []
    for ref in (str(uuid.uuid4()), "not-a-key-id", str(bobs.public_id)):
        response = _api(funded).post(URL, {**ORDER, "ssh_key": ref}, format="json")
        body = _assert_field_error(response, "ssh_key")
        answers.append(body["detail"].replace(ref, "<ref>"))
    # Bob's key answers exactly as one that does not exist: no way to learn it is one.
    assert len(set(answers)) == 1, answers
    assert not Instance.objects.exists()


def test_an_unknown_or_foreign_disk_is_a_400_naming_the_field(sim_fleet, funded, bob) -> None:
    from billing import services as billing

    billing.grant_voucher(bob, Decimal("100"), reason="test", valid_days=30)
    bobs = disk_service.create_disk(bob, name="bob-data", size_gb=10, region="xiamen")
    for ref in (str(uuid.uuid4()), str(bobs.public_id)):
        response = _api(funded).post(URL, {**ORDER, "disks": [{"id": ref}]}, format="json")
        _assert_field_error(response, "disks")
    assert not Instance.objects.exists()


def test_unknown_assets_keep_their_code_and_name_the_field(sim_fleet, funded) -> None:
    response = _api(funded).post(URL, {**ORDER, "assets": [str(uuid.uuid4())]}, format="json")
    body = _assert_field_error(response, "assets", code="unknown_asset")
    assert len(body["assets"]) == 1


# --- image: version slug, version id or family slug ----------------------------------------------
def test_a_family_slug_orders_its_newest_version_for_the_card(
    sim_fleet, funded, pytorch, django_capture_on_commit_callbacks
) -> None:
    api = _api(funded)
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(URL, {**ORDER, "image": "pytorch"}, format="json")
    assert response.status_code == 202, response.json()
    assert response.json()["image"] == "pt-2.4.1"  # not the recommended, nor 2.10 (A800 only)
    assert Instance.objects.get().container == pytorch["2.4.1"].container
    # On an A800 the same family slug is 2.10.0: compared as numbers, not as text.
    with django_capture_on_commit_callbacks(execute=True):
        a800 = api.post(URL, {"gpu_model": "A800", "cards": 1, "image": "pytorch"}, format="json")
    assert a800.status_code == 202, a800.json()
    assert a800.json()["image"] == "pt-2.10.0"


def test_a_version_slug_or_id_orders_that_version(
    sim_fleet, funded, pytorch, django_capture_on_commit_callbacks
) -> None:
    api = _api(funded)
    with django_capture_on_commit_callbacks(execute=True):
        by_slug = api.post(URL, {**ORDER, "image": "pt-2.1.2"}, format="json")
        by_id = api.post(URL, {**ORDER, "image": str(pytorch["2.3.1"].public_id)}, format="json")
    assert by_slug.status_code == by_id.status_code == 202, (by_slug.json(), by_id.json())
    assert by_slug.json()["image"] == "pt-2.1.2"
    assert by_id.json()["image"] == "pt-2.3.1"
    # An unlisted version is not orderable by its slug either.
    _assert_field_error(api.post(URL, {**ORDER, "image": "pt-2.12.0"}, format="json"), "image")


def test_the_order_preview_resolves_a_family_like_the_order(sim_fleet, funded, pytorch) -> None:
    from slices import services

    preview = services.preview_order(funded, gpu_model="RTX4090", cards=1, image="pytorch")
    assert preview.image.slug == "pt-2.4.1" and not preview.image_warning
    unknown = services.preview_order(funded, gpu_model="RTX4090", cards=1, image="nope")
    assert unknown.image is None and unknown.image_warning and not unknown.orderable


# --- names ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", HOSTILE)
def test_instance_and_disk_names_follow_the_same_rules(sim_fleet, funded, name: str) -> None:
    api = _api(funded)
    ordered = api.post(URL, {**ORDER, "name": name}, format="json")
    _assert_field_error(ordered, "name")
    disk = api.post(
        "/api/v1/disks/", {"name": name, "size_gb": 10, "region": "xiamen"}, format="json"
    )
    _assert_field_error(disk, "name")
    with pytest.raises(DiskRefused):
        disk_service.create_disk(funded, name=name, size_gb=10, region="xiamen")
    assert not Instance.objects.exists() and not Disk.objects.exists()
    # The same name as an SSH key or an API token is refused by the same rule.
    for path, body in (
        ("/api/v1/api-tokens/", {"name": name}),
        ("/api/v1/ssh-keys/", {"name": name, "public_key": ed25519_public_key("x@y")}),
    ):
        response = api.post(path, body, format="json")
        assert response.status_code == 400 and "name" in response.json()["fields"], path


def test_names_are_trimmed_and_nfc_normalised_everywhere(
    sim_fleet, funded, django_capture_on_commit_callbacks
) -> None:
    decomposed = "  cafe\u0301 训练  "  # "é" as e + combining acute, and spaces around
    api = _api(funded)
    with django_capture_on_commit_callbacks(execute=True):
        ordered = api.post(URL, {**ORDER, "name": decomposed}, format="json")
    assert ordered.status_code == 202, ordered.json()
    disk = disk_service.create_disk(funded, name=decomposed, size_gb=10, region="xiamen")
    key = console_services.add_ssh_key(
        funded, name=decomposed, public_key=ed25519_public_key("x@y")
    )
    token, _raw = console_services.create_api_token(funded, name=decomposed)
    names = {Instance.objects.get().name, disk.name, key.name, token.name}
    assert names == {"caf\u00e9 训练"}, names


def test_a_disk_name_over_63_characters_is_refused_like_an_instance_name(sim_fleet, funded) -> None:
    with pytest.raises(DiskRefused) as refused:
        disk_service.create_disk(funded, name="d" * 64, size_gb=10, region="xiamen")
    assert refused.value.field == "name" and refused.value.params["max"] == 63
    response = _api(funded).post(URL, {**ORDER, "name": "i" * 64}, format="json")
    assert response.status_code == 400 and "name" in response.json()["fields"]
