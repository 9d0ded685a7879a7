"""The marketplace API's refusals are domain errors in the request's language, with the field at
fault named (they were English-only ``ApiError`` texts), and change nothing."""

from __future__ import annotations

import pytest

from tests.support.api import assert_error

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("lang", "text"), [("en", "gpu must be one of"), ("zh-hans", "gpu 必须是")]
)
def test_an_unknown_gpu_filter_names_the_choices(alice_api, lang: str, text: str) -> None:
    r = alice_api.get("/api/v1/images/?gpu=TPU", HTTP_ACCEPT_LANGUAGE=lang)
    body = assert_error(r, 400, "invalid", field="gpu")
    assert text in body["detail"] and "RTX4090" in body["detail"]


@pytest.mark.parametrize(("lang", "text"), [("en", "No such image."), ("zh-hans", "没有这个镜像")])
def test_an_unknown_image_is_404(alice_api, lang: str, text: str) -> None:
    r = alice_api.get("/api/v1/images/no-such-image/", HTTP_ACCEPT_LANGUAGE=lang)
    assert_error(r, 404, "not_found", detail=text)


@pytest.mark.parametrize(("lang", "text"), [("en", "asset id"), ("zh-hans", "资产")])
def test_mounts_without_assets_names_the_parameter(alice_api, lang: str, text: str) -> None:
    r = alice_api.get("/api/v1/mount-plan/", HTTP_ACCEPT_LANGUAGE=lang)
    assert_error(r, 400, "invalid", field="assets", detail=text)


def test_a_bad_list_filter_names_its_field(alice_api) -> None:
    r = alice_api.get("/api/v1/models/?sort=nonsense", HTTP_ACCEPT_LANGUAGE="en")
    body = assert_error(r, 400, "invalid", field="sort")
    assert "sort" in body["detail"]
