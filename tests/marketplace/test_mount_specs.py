"""What an order mounts: build_mount_specs (the service the ordering flow calls), the gated-license
rule, and the same through the API."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from marketplace import services
from marketplace.choices import AssetKind
from marketplace.models import LicenseAcceptance
from marketplace.services import MountRefused
from tests.marketplace.factories import AssetFactory, LicenseFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def llama2():  # noqa: ANN201
    return LicenseFactory(key="llama2", name="Llama 2 Community License", requires_acceptance=True)


@pytest.fixture
def llama(llama2):  # noqa: ANN001, ANN201
    return AssetFactory(hub_id="meta-llama/Llama-2-7b-hf", publisher="meta-llama", license=llama2)


@pytest.fixture
def alpaca():  # noqa: ANN201
    return AssetFactory(kind=AssetKind.DATASET, hub_id="tatsu-lab/alpaca", publisher="tatsu-lab")


def test_an_order_mounts_each_asset_read_only_from_the_pfs_cache(alice, alpaca) -> None:  # noqa: ANN001
    model = AssetFactory(hub_id="Qwen/Qwen2-7B", publisher="Qwen")
    specs = services.build_mount_specs(alice, [str(alpaca.public_id), model.public_id])
    assert [s.as_dict() for s in specs] == [
        {
            "kind": "model",
            "hub_id": "Qwen/Qwen2-7B",
            "slug": "qwen--qwen2-7b",
            "source": "/pfs/public/models/Qwen/Qwen2-7B",
            "target": "/models/qwen--qwen2-7b",
            "read_only": True,
        },
        {
            "kind": "dataset",
            "hub_id": "tatsu-lab/alpaca",
            "slug": "tatsu-lab--alpaca",
            "source": "/pfs/public/datasets/tatsu-lab/alpaca",
            "target": "/datasets/tatsu-lab--alpaca",
            "read_only": True,
        },
    ]


def test_a_gated_asset_is_refused_until_its_license_is_accepted(
    alice, llama, llama2, alpaca
) -> None:  # noqa: ANN001
    with pytest.raises(MountRefused) as refused:
        services.build_mount_specs(alice, [llama.public_id, alpaca.public_id])
    assert refused.value.code == services.LICENSE_NOT_ACCEPTED
    assert refused.value.assets == ["meta-llama/Llama-2-7b-hf"]
    assert "llama2" in refused.value.message()

    services.accept_license(alice, llama2)

    specs = services.build_mount_specs(alice, [llama.public_id, alpaca.public_id])
    assert [s.target for s in specs] == [
        "/models/meta-llama--llama-2-7b-hf",
        "/datasets/tatsu-lab--alpaca",
    ]


def test_one_acceptance_unlocks_every_asset_under_that_license(alice, llama, llama2) -> None:  # noqa: ANN001
    chat = AssetFactory(hub_id="meta-llama/Llama-2-7b-chat-hf", license=llama2)
    services.accept_license(alice, llama2)
    assert len(services.build_mount_specs(alice, [llama.public_id, chat.public_id])) == 2


def test_acceptance_is_per_user(alice, bob, llama, llama2) -> None:  # noqa: ANN001
    services.accept_license(alice, llama2)
    with pytest.raises(MountRefused):
        services.build_mount_specs(bob, [llama.public_id])


def test_accepting_twice_records_one_acceptance(alice, llama2) -> None:  # noqa: ANN001
    first, created = services.accept_license(alice, llama2)
    again, created_again = services.accept_license(alice, llama2)
    assert (created, created_again) == (True, False)
    assert first.pk == again.pk
    assert LicenseAcceptance.objects.filter(user=alice).count() == 1
    assert first.license_name == "Llama 2 Community License"


def test_unknown_unlisted_and_malformed_ids_are_refused(alice, alpaca) -> None:  # noqa: ANN001
    with pytest.raises(MountRefused) as refused:
        services.build_mount_specs(alice, [uuid.uuid4()])
    assert refused.value.code == services.UNKNOWN_ASSET
    with pytest.raises(MountRefused):
        services.build_mount_specs(alice, ["../../etc"])
    alpaca.is_listed = False
    alpaca.save()
    with pytest.raises(MountRefused):
        services.build_mount_specs(alice, [alpaca.public_id])


def test_asking_for_the_same_asset_twice_mounts_it_once(alice, alpaca) -> None:  # noqa: ANN001
    assert len(services.build_mount_specs(alice, [alpaca.public_id, str(alpaca.public_id)])) == 1


def test_order_form_url_presets_image_and_assets(alpaca) -> None:  # noqa: ANN001
    assert services.order_form_url(assets=[alpaca]) == f"/instances/new/?assets={alpaca.public_id}"


# --- the same through the API -------------------------------------------------------------------
def test_mount_plan_api_answers_403_until_the_license_is_accepted(
    alice_client: Client, llama, llama2
) -> None:  # noqa: ANN001
    url = f"/api/v1/mount-plan/?assets={llama.public_id}"
    refused = alice_client.get(url)
    assert refused.status_code == 403
    assert refused.json()["error"] == "license_not_accepted"
    assert refused.json()["assets"] == ["meta-llama/Llama-2-7b-hf"]

    accepted = alice_client.post(f"/api/v1/licenses/{llama2.public_id}/accept/")
    assert accepted.status_code == 200 and accepted.json()["accepted"] is True

    plan = alice_client.get(url)
    assert plan.status_code == 200
    assert plan.json()["mounts"][0]["target"] == "/models/meta-llama--llama-2-7b-hf"
    assert plan.json()["mounts"][0]["read_only"] is True


def test_license_api_says_whether_you_accepted(
    alice_client: Client, bob_client: Client, llama2
) -> None:  # noqa: ANN001
    alice_client.post(f"/api/v1/licenses/{llama2.public_id}/accept/")
    mine = alice_client.get(f"/api/v1/licenses/{llama2.public_id}/").json()
    theirs = bob_client.get(f"/api/v1/licenses/{llama2.public_id}/").json()
    assert (mine["accepted"], theirs["accepted"]) == (True, False)


def test_the_catalogue_api_needs_a_login(client: Client) -> None:
    assert client.get("/api/v1/models/").status_code in (401, 403)
    assert client.get("/api/v1/mount-plan/?assets=x").status_code in (401, 403)


def test_more_ids_than_mounts_are_refused_before_any_lookup(
    alice,
    django_assert_num_queries,  # noqa: ANN001
) -> None:
    with django_assert_num_queries(0), pytest.raises(MountRefused) as refused:
        services.build_mount_specs(alice, [uuid.uuid4() for _ in range(1000)])
    assert refused.value.code == services.INVALID_MOUNT


def test_a_recipe_can_name_assets_by_hub_id(alice, llama, llama2) -> None:  # noqa: ANN001
    from django.http import Http404

    found = services.get_asset_by_hub_id("model", "meta-llama/Llama-2-7b-hf")
    assert found.pk == llama.pk and found.gated
    with pytest.raises(Http404):
        services.get_asset_by_hub_id("dataset", "meta-llama/Llama-2-7b-hf")
    services.accept_license(alice, llama2)
    (spec,) = services.build_mount_specs(alice, [found.public_id])
    assert spec.target == "/models/meta-llama--llama-2-7b-hf"
