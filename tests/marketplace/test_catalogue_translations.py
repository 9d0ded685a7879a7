"""The catalogue's own prose in the reader's language, and the licence badge after acceptance."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import translation

from marketplace import catalogue, services
from marketplace.templatetags.marketplace import catalogue_text
from tests.marketplace.factories import (
    AssetFactory,
    ImageFactory,
    ImageVersionFactory,
    LicenseFactory,
)

GATED = 'text-bg-warning">需授权<'  # the badge, not the filter's option
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def _shipped_texts() -> list[str]:
    licences = [r.terms for r in catalogue.read_licenses().values() if r.terms]
    return licences + [image.summary for image in catalogue.read_images() if image.summary]


def test_every_shipped_summary_has_a_chinese_translation() -> None:
    texts = _shipped_texts()
    assert len(texts) >= 13
    for text in texts:
        with translation.override("zh-hans"):
            chinese = catalogue_text(text)
        with translation.override("en"):
            assert catalogue_text(text) == text
        assert chinese != text and CJK.search(chinese), text


def test_text_written_in_the_admin_is_shown_as_written() -> None:
    with translation.override("zh-hans"):
        assert (
            catalogue_text("Our own build, with extra tools.") == "Our own build, with extra tools."
        )
        assert catalogue_text("") == ""


def _main(html: str) -> str:
    main = re.search(r"<main.*?</main>", html, re.S).group(0)
    return re.sub(r"<[^>]+>", " ", main)


@pytest.mark.django_db
def test_image_pages_describe_images_in_the_readers_language(client: Client) -> None:
    summary = next(i.summary for i in catalogue.read_images() if i.slug == "pytorch")
    image = ImageFactory(slug="pytorch", name="PyTorch", summary=summary)
    ImageVersionFactory(image=image)
    for url in (reverse("marketplace:image-list"), image.get_absolute_url()):
        zh = _main(client.get(url, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode())
        assert "PyTorch 官方开发镜像" in zh and "development images" not in zh
        en = _main(client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode())
        assert summary in en.replace("\n", " ")
        assert not CJK.search(en), CJK.findall(en)


@pytest.mark.django_db
def test_a_gated_licence_explains_itself_in_chinese_and_the_badge_follows_acceptance(
    alice, alice_client: Client
) -> None:  # noqa: ANN001
    terms = catalogue.read_licenses()["llama2"].terms
    licence = LicenseFactory(key="llama2", name="Llama 2", requires_acceptance=True, terms=terms)
    asset = AssetFactory(hub_id="meta-llama/Llama-2-7b-hf", license=licence)
    detail = asset.get_absolute_url()
    listing = reverse("marketplace:model-list")

    html = alice_client.get(detail).content.decode()
    assert "Meta 的 Llama 2 社区许可协议" in html and "Acceptable Use Policy" not in html
    assert GATED in html and "已接受许可" not in html
    assert GATED in alice_client.get(listing).content.decode()

    services.accept_license(alice, licence)
    for url in (detail, listing, licence.get_absolute_url()):
        html = alice_client.get(url).content.decode()
        assert 'text-bg-success">已接受许可<' in html and GATED not in html, url
