"""Browse pages: full page vs htmx fragment, URL kept in sync, pagination, detail pages, images,
and the number of queries of every list (no N+1)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from marketplace.choices import AssetKind
from marketplace.forms import PAGE_SIZE
from marketplace.models import Asset, LicenseAcceptance
from tests.marketplace.factories import (
    AssetFactory,
    ImageFactory,
    ImageVersionFactory,
    LicenseFactory,
)

pytestmark = pytest.mark.django_db


def test_the_list_page_is_a_full_page_and_htmx_gets_only_the_results(alice_client: Client) -> None:
    AssetFactory(hub_id="acme/zebra-7b")
    full = alice_client.get("/marketplace/?q=zebra").content.decode()
    assert "<html" in full and 'id="asset-filters"' in full and "acme/zebra-7b" in full
    fragment = alice_client.get("/marketplace/?q=zebra", headers={"HX-Request": "true"})
    body = fragment.content.decode()
    assert "<html" not in body and 'id="asset-filters"' not in body
    assert body.strip().startswith('<section id="results"') and "acme/zebra-7b" in body


def test_the_filters_push_the_url_and_work_without_javascript(alice_client: Client) -> None:
    html = alice_client.get("/marketplace/").content.decode()
    # htmx swaps the results and pushes the filter URL (shareable; back button restores it)...
    assert 'hx-push-url="true"' in html and 'hx-target="#results"' in html
    # ...and a history restore asks the server again instead of a stale snapshot.
    assert 'hx-history="false"' in html
    # Without JavaScript the same form is a plain GET.
    assert 'method="get" action="/marketplace/"' in html


def test_a_history_restore_request_gets_the_whole_page(alice_client: Client) -> None:
    response = alice_client.get(
        "/marketplace/?q=x", headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}
    )
    assert "<html" in response.content.decode()


def test_pagination_keeps_the_filters_in_its_links(alice_client: Client) -> None:
    for n in range(PAGE_SIZE + 3):
        AssetFactory(hub_id=f"acme/pager-{n:02d}")
    first = alice_client.get("/marketplace/?q=pager&sort=-name").content.decode()
    assert first.count("data-hub-id=") == PAGE_SIZE
    assert 'href="?q=pager&amp;sort=-name&amp;page=2"' in first
    second = alice_client.get("/marketplace/?q=pager&sort=-name&page=2").content.decode()
    assert second.count("data-hub-id=") == 3
    assert "acme/pager-00" in second
    # A page number past the end shows the last page rather than an error.
    assert alice_client.get("/marketplace/?q=pager&page=99").status_code == 200


def test_visitors_can_browse_without_an_account(client: Client) -> None:
    AssetFactory(hub_id="acme/public-model")
    assert "acme/public-model" in client.get("/marketplace/").content.decode()
    assert client.get("/marketplace/models/acme--public-model/").status_code == 200
    assert client.get("/images/").status_code == 200


def test_model_detail_shows_metadata_license_mount_and_the_order_link(alice_client: Client) -> None:
    asset = AssetFactory(
        hub_id="acme/Detail-13B", params_billion=13.0, size_gb=26.0, size_estimated=True
    )
    html = alice_client.get("/marketplace/models/acme--detail-13b/").content.decode()
    assert "acme/Detail-13B" in html
    assert "13 B" in html and "≈ 26 GB" in html
    assert "/models/acme--detail-13b" in html and "/pfs/public/models/acme/Detail-13B" in html
    assert "Apache License 2.0" in html
    assert f'href="/instances/new/?assets={asset.public_id}"' in html


def test_dataset_detail_mounts_under_datasets(alice_client: Client) -> None:
    AssetFactory(kind=AssetKind.DATASET, hub_id="glue", publisher="", params_billion=None)
    html = alice_client.get("/marketplace/datasets/glue/").content.decode()
    assert "/datasets/glue" in html and "/pfs/public/datasets/glue" in html
    # The same slug is not a model.
    assert alice_client.get("/marketplace/models/glue/").status_code == 404


def test_a_gated_model_needs_acceptance_before_the_order_link_appears(
    alice, alice_client: Client
) -> None:
    llama2 = LicenseFactory(
        key="llama2", name="Llama 2 Community License", requires_acceptance=True
    )
    asset = AssetFactory(hub_id="meta-llama/Llama-2-7b-hf", license=llama2)
    page = "/marketplace/models/meta-llama--llama-2-7b-hf/"
    html = alice_client.get(page).content.decode()
    assert "/instances/new/" not in html
    assert f"/marketplace/licenses/{llama2.public_id}/accept/" in html

    response = alice_client.post(
        f"/marketplace/licenses/{llama2.public_id}/accept/", {"next": page}
    )
    assert response.status_code == 302 and response["Location"] == page
    assert LicenseAcceptance.objects.filter(user=alice, license=llama2).count() == 1
    html = alice_client.get(page).content.decode()
    assert f"/instances/new/?assets={asset.public_id}" in html


def test_accepting_never_redirects_off_site(alice_client: Client) -> None:
    gated = LicenseFactory(key="gemma", requires_acceptance=True)
    response = alice_client.post(
        f"/marketplace/licenses/{gated.public_id}/accept/", {"next": "https://evil.example/"}
    )
    assert response["Location"] == f"/marketplace/licenses/{gated.public_id}/"


def test_visitors_are_sent_to_log_in_before_accepting(client: Client) -> None:
    gated = LicenseFactory(key="gemma", requires_acceptance=True)
    response = client.post(f"/marketplace/licenses/{gated.public_id}/accept/")
    assert response.status_code == 302 and "login" in response["Location"]
    assert not LicenseAcceptance.objects.exists()


def test_unknown_assets_and_licenses_are_404(alice_client: Client) -> None:
    assert alice_client.get("/marketplace/models/no--such/").status_code == 404
    missing = "/marketplace/licenses/00000000-0000-0000-0000-000000000001/"
    assert alice_client.get(missing).status_code == 404
    assert alice_client.get("/images/no-such-image/").status_code == 404


def test_image_pages_list_versions_and_launch_into_the_order_form(alice_client: Client) -> None:
    image = ImageFactory(slug="pytorch", name="PyTorch")
    ImageVersionFactory(image=image, slug="pytorch-2.1.2-cuda12.1-py3.10", recommended=True)
    ImageVersionFactory(image=image, slug="old-a800-only", cuda="11.3", gpu_models=["A800"])
    html = alice_client.get("/images/").content.decode()
    assert "PyTorch" in html and "pytorch/pytorch:2.1.2-cuda12.1-cudnn8-devel" in html
    detail = alice_client.get("/images/pytorch/").content.decode()
    assert 'href="/instances/new/?image=pytorch-2.1.2-cuda12.1-py3.10"' in detail
    assert "JupyterLab 8888/http" in detail
    h800 = alice_client.get("/images/?gpu=H800", headers={"HX-Request": "true"}).content.decode()
    assert "CUDA 11.3" not in h800 and "CUDA 12.1" in h800
    # An unknown GPU is no filter at all.
    assert alice_client.get("/images/?gpu=<script>").status_code == 200


# --- query counts -------------------------------------------------------------------------------
def _shelf(n: int) -> None:
    licenses = [LicenseFactory(key=f"lic-{i}", requires_acceptance=i == 0) for i in range(3)]
    for i in range(n):
        AssetFactory(hub_id=f"acme/count-{i}", license=licenses[i % 3], modalities="text,image")
        AssetFactory(kind=AssetKind.DATASET, hub_id=f"acme/data-{i}", license=licenses[i % 3])


@pytest.mark.parametrize("rows", [3, PAGE_SIZE + 5])
@pytest.mark.parametrize("url", ["/marketplace/", "/marketplace/datasets/"])
def test_list_page_queries_do_not_grow_with_rows(
    rows: int, url: str, alice_client: Client, django_assert_num_queries
) -> None:
    _shelf(rows)
    # session + user, facets (cache miss), count, one page of rows with their licenses joined
    with django_assert_num_queries(5):
        assert alice_client.get(url + "?sort=-size&gated=no").status_code == 200
    # The fragment: facets cached; count + rows, and (the page lists gated assets) the reader's
    # accepted licences for their badges: session, user, acceptances. Constant in the rows.
    with django_assert_num_queries(5):
        alice_client.get(url + "?q=acme&modality=text", headers={"HX-Request": "true"})


@pytest.mark.parametrize("rows", [3, PAGE_SIZE + 5])
def test_list_api_queries_do_not_grow_with_rows(
    rows: int, alice_client: Client, django_assert_max_num_queries
) -> None:
    _shelf(rows)
    # session + user, one page of rows with their licenses joined, and the count only when the
    # page cannot tell it (the pagination skips it when a first page is not full)
    with django_assert_max_num_queries(4):
        assert alice_client.get("/api/v1/models/?q=acme&sort=name").status_code == 200
    with django_assert_max_num_queries(4):
        assert alice_client.get("/api/v1/datasets/?gated=yes").status_code == 200


def test_image_list_queries_do_not_grow_with_versions(
    alice_client: Client, django_assert_num_queries
) -> None:
    for i in range(3):
        image = ImageFactory()
        for _ in range(i + 2):
            ImageVersionFactory(image=image)
    # session + user, images, their versions (prefetched)
    with django_assert_num_queries(4):
        assert alice_client.get("/images/").status_code == 200
    with django_assert_num_queries(4):
        assert alice_client.get("/api/v1/images/").status_code == 200


def test_operators_reach_the_catalogue_in_the_admin(admin_client: Client) -> None:
    asset = AssetFactory(hub_id="acme/admin-model")
    LicenseFactory(key="gemma", requires_acceptance=True)
    for url in (
        "/admin/marketplace/asset/",
        f"/admin/marketplace/asset/{asset.pk}/change/",
        "/admin/marketplace/license/",
        "/admin/marketplace/image/",
        "/admin/marketplace/licenseacceptance/",
    ):
        assert admin_client.get(url).status_code == 200, url


def test_the_admin_refuses_an_asset_that_could_not_be_mounted(admin_client: Client) -> None:
    license = LicenseFactory(key="mit")
    response = admin_client.post(
        "/admin/marketplace/asset/add/",
        {
            "kind": "model",
            "hub_id": "acme/../../etc",
            "slug": "../root",
            "name": "bad",
            "source": "operator",
            "license": license.pk,
            "is_listed": "on",
            "tasks": "",
            "modalities": "",
            "task": "",
        },
    )
    assert response.status_code == 200  # the form again, with errors
    errors = response.context["adminform"].form.errors
    assert "hub_id" in errors and "slug" in errors
    assert not Asset.objects.filter(name="bad").exists()


def test_gpu_models_use_the_fleet_codes_and_accept_the_written_names(alice_client: Client) -> None:
    image = ImageFactory(slug="colossal-ai", name="Colossal-AI")
    modern = ImageVersionFactory(
        image=image, slug="colossalai-0.3.6", gpu_models=["RTX4090", "A800", "H800"]
    )
    legacy = ImageVersionFactory(image=image, slug="colossalai-0.3.0", gpu_models=["A800"])
    assert modern.supports("RTX 4090") and modern.supports("RTX4090")
    assert not legacy.supports("RTX 4090") and not legacy.supports("no such card")
    html = alice_client.get("/images/?gpu=RTX+4090").content.decode()
    assert "CUDA 12.1" in html
    body = alice_client.get("/api/v1/images/?gpu=RTX4090").json()
    assert [v["slug"] for v in body[0]["versions"]] == ["colossalai-0.3.6"]
    assert alice_client.get("/api/v1/images/?gpu=V100").status_code == 400
    detail = alice_client.get("/images/colossal-ai/").content.decode()
    assert "RTX 4090" in detail


# --- the order form's asset picker --------------------------------------------------------------
def test_the_picker_searches_and_keeps_what_was_picked(alice_client: Client) -> None:
    picked = AssetFactory(kind=AssetKind.DATASET, hub_id="tatsu-lab/alpaca")
    AssetFactory(hub_id="acme/picker-model-7b")
    html = alice_client.get(
        f"/marketplace/picker/?asset_q=picker 7b&assets={picked.public_id}",
        headers={"HX-Request": "true"},
    ).content.decode()
    assert html.strip().startswith('<div id="asset-picker-results">')
    assert re.search(rf'value="{picked.public_id}"[^>]*\n?\s*checked', html)
    assert "acme/picker-model-7b" in html and "/models/acme--picker-model-7b" in html


def test_the_picker_disables_gated_assets_until_the_license_is_accepted(
    alice, alice_client: Client
) -> None:
    from marketplace import services

    llama2 = LicenseFactory(key="llama2", requires_acceptance=True)
    llama = AssetFactory(hub_id="meta-llama/Llama-2-7b-hf", license=llama2)
    url = "/marketplace/picker/?asset_q=llama"
    html = alice_client.get(url).content.decode()
    assert re.search(rf'value="{llama.public_id}"[^>]*disabled', html, re.S)
    assert "accept the license first" in html or "请先接受" in html
    services.accept_license(alice, llama2)
    html = alice_client.get(url).content.decode()
    assert not re.search(rf'value="{llama.public_id}"[^>]*disabled', html, re.S)


def test_the_picker_needs_a_login_and_ignores_bad_ids(client: Client, alice_client: Client) -> None:
    assert client.get("/marketplace/picker/").status_code == 302
    assert alice_client.get("/marketplace/picker/?assets=../../x&assets=1").status_code == 200


def test_picker_queries_do_not_grow_with_rows(
    alice_client: Client, django_assert_num_queries
) -> None:
    gated = LicenseFactory(key="gemma", requires_acceptance=True)
    picked = [AssetFactory(hub_id=f"acme/picked-{i}", license=gated) for i in range(5)]
    for i in range(15):
        AssetFactory(hub_id=f"acme/found-{i}")
    query = "&".join(f"assets={a.public_id}" for a in picked)
    # session + user, the picked assets, the matches, the user's accepted licenses
    with django_assert_num_queries(5):
        alice_client.get(f"/marketplace/picker/?asset_q=acme&{query}")


def test_the_order_form_includes_the_whole_picker(alice) -> None:
    from django.template.loader import render_to_string

    from marketplace import services

    picked = AssetFactory(kind=AssetKind.DATASET, hub_id="glue", publisher="")
    html = render_to_string(
        "marketplace/_asset_picker.html",
        {"picker": services.asset_picker(alice, [picked.public_id], "")},
    )
    assert 'id="asset-picker"' in html and 'name="asset_q"' in html
    assert 'hx-get="/marketplace/picker/"' in html
    assert f'value="{picked.public_id}"' in html and "/datasets/glue" in html


def test_license_list_api_queries_do_not_grow_with_rows(
    alice, alice_client: Client, django_assert_max_num_queries
) -> None:
    from marketplace import services

    for i in range(12):
        lic = LicenseFactory(key=f"many-{i}", requires_acceptance=i % 2 == 0)
        if i % 4 == 0:
            services.accept_license(alice, lic)
    # session + user, the caller's acceptances, one page (and the count unless the page tells it)
    with django_assert_max_num_queries(5):
        body = alice_client.get("/api/v1/licenses/").json()
    accepted = {r["key"]: r["accepted"] for r in body["results"]}
    assert accepted["many-0"] is True and accepted["many-2"] is False and accepted["many-1"] is True


def test_the_instance_page_partial_lists_mounts() -> None:
    from django.template.loader import render_to_string

    from marketplace.mounts import AssetRef, plan_mounts

    specs = plan_mounts([AssetRef("dataset", "squad", "squad")])
    for mounts in (specs, [s.as_dict() for s in specs]):
        html = render_to_string("marketplace/_mounts.html", {"mounts": mounts})
        assert "squad" in html and "<code>/datasets/squad</code>" in html
    assert "instance-mounts" in render_to_string("marketplace/_mounts.html", {"mounts": []})
