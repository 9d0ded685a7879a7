"""AI applications (issue 20) on the simulated fleet: the manifests load and name catalogue
entries that exist (a broken one is refused with ``FILE: reason``), /apps/ and the API list them
with prices in Chinese and English, a launch orders an instance like any other that becomes
ready when the app's health check answers, and its API opens with the instance's own key only."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from asgiref.sync import async_to_sync
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services as billing
from billing.seed import seed_default_prices
from marketplace import aiapps
from marketplace.catalogue import CatalogueError, read_catalogue, read_images
from slices.choices import InstanceState
from slices.models import Instance
from slices.services import apps
from slices.services.instances import release_instance
from tests.slices.factories import load_small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(full_catalogue, settings) -> None:  # noqa: ANN001
    settings.SIM_TIME_SCALE = 0
    settings.APP_HEALTH_INTERVAL = 0.01
    seed_default_prices()
    load_small_fleet()


@pytest.fixture
def newcomer(alice):  # noqa: ANN001, ANN201
    """A verified new account: the 10.00 元 trial credit and nothing else."""
    assert billing.grant_trial_credit(alice)
    return alice


def _body(response) -> bytes:  # noqa: ANN001
    """A proxied response's body (the proxy streams asynchronously)."""
    if not response.streaming:
        return response.content

    async def collect() -> bytes:
        return b"".join([bytes(c) async for c in response.streaming_content])

    return async_to_sync(collect)()


def _chat() -> aiapps.AiApp:
    app = aiapps.get_app("llm-chat")
    assert app is not None
    return app


# -- the manifests -----------------------------------------------------------------------------


def test_every_shipped_manifest_loads_and_names_catalogue_entries_that_exist() -> None:
    shipped = aiapps.read_apps()
    assert {a.category for a in shipped} == set(aiapps.CATEGORIES)
    versions = {v.slug for image in read_images() for v in image.versions}
    models = {a.hub_id for a in read_catalogue("model")}
    datasets = {a.hub_id for a in read_catalogue("dataset")}
    for app in shipped:
        aiapps.check_references(app, versions, models, datasets)
        assert app.name_zh and app.summary_zh and app.name and app.summary
        for name in app.files:
            assert (app.directory / name).is_file()
    chat = _chat()
    # The manifest's folded lines join without a space between Chinese characters.
    assert "Llama 3.1）对话" in chat.summary_zh and "） " not in chat.summary_zh
    assert chat.api is not None and chat.api.kind == "openai"
    assert "Qwen/Qwen2.5-7B-Instruct" == chat.default_model
    assert {"THUDM/chatglm3-6b", "baichuan-inc/Baichuan2-7B-Chat"} <= set(chat.models)


BROKEN = [
    ("slug: other-name\n", "slug 'other-name' must be valid and name its directory"),
    ("category: poetry\n", "category must be one of"),
    ("gpus: [{model: V100, min_cards: 1}]\n", "gpus[0].model 'V100' is not a GPU model"),
    ("gpus: [{model: RTX4090, min_cards: 4, max_cards: 2}]\n", "gpus[0].max_cards must be"),
    ("health: {port: 9999, path: /healthz}\n", "health.port 9999 is not one of the app's ports"),
    ("health: {port: 8000, path: ../etc}\n", "health.path '../etc' must be an absolute URL path"),
    ("api: {kind: grpc, port: 8000}\n", "api.kind must be one of"),
    ("files: [missing.py]\n", "file 'missing.py' is not in the app's directory"),
    ("models: [not a hub id]\n", "models 'not a hub id' is not a hub id"),
    ("ready_seconds: 0\n", "ready_seconds must be a whole number from 1 to 1800"),
    ("env: {BAD-NAME: x}\n", "env 'BAD-NAME' is not NAME: value"),
    ("ports: [{port: 80, name: web}]\n", "ports[0].port must be a whole number from 1024"),
]


@pytest.mark.parametrize(("override", "reason"), BROKEN)
def test_a_broken_manifest_is_refused_naming_the_file_and_the_reason(
    tmp_path: Path, override: str, reason: str
) -> None:
    app_dir = tmp_path / "llm-chat"
    shutil.copytree(_chat().directory, app_dir)
    manifest = app_dir / aiapps.MANIFEST
    data = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    data.update(yaml.safe_load(override))
    manifest.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    with pytest.raises(CatalogueError) as info:
        aiapps.read_app(app_dir)
    assert str(info.value).startswith(f"{manifest}: ")
    assert reason in str(info.value)


def test_a_manifest_naming_a_missing_image_or_model_is_refused() -> None:
    chat = _chat()
    with pytest.raises(
        CatalogueError,
        match=r"llm-chat/manifest.yaml: image 'ai-apps-[^']+' is not an image version",
    ):
        aiapps.check_references(chat, {"x-other"}, set(chat.models), set())
    with pytest.raises(CatalogueError, match="model 'THUDM/chatglm3-6b' is not in the catalogue"):
        aiapps.check_references(chat, {chat.image}, {"Qwen/Qwen2.5-7B-Instruct"}, set())


# -- the pages and the API ---------------------------------------------------------------------


def test_the_apps_page_lists_every_app_with_its_price_in_chinese_and_english(world) -> None:  # noqa: ANN001
    zh = Client(HTTP_ACCEPT_LANGUAGE="zh-hans").get("/apps/")
    assert zh.status_code == 200
    text = zh.content.decode()
    for name in ("大模型对话", "文生图（SDXL）", "浏览器里微调（LoRA）", "JupyterLab 工作台"):
        assert name in text
    assert "1.90 元" in text  # one RTX 4090 at 1.90 元 per card-hour, from the price book
    en = Client(HTTP_ACCEPT_LANGUAGE="en").get("/apps/")
    assert "Chat with an LLM" in en.content.decode() and "1.90 元" in en.content.decode()
    api = APIClient().get("/api/v1/apps/", HTTP_ACCEPT_LANGUAGE="en")
    assert api.status_code == 200
    chat = next(a for a in api.json() if a["slug"] == "llm-chat")
    assert chat["name"] == "Chat with an LLM" and chat["name_zh"] == "大模型对话"
    rtx = next(g for g in chat["gpus"] if g["gpu_model"] == "RTX4090")
    assert Decimal(rtx["price_per_hour"]) == Decimal("1.90")
    assert Decimal(rtx["trial_hours"]) == Decimal("5.3")  # 10.00 元 / 1.90 元 per hour
    assert chat["api"] == {"kind": "openai", "port": 8000, "base_path": "/v1"}
    assert APIClient().get("/api/v1/apps/nope/").status_code == 404


def test_the_app_page_states_the_price_and_how_long_the_trial_credit_lasts(
    world, newcomer, alice_client
) -> None:  # noqa: ANN001
    page = alice_client.get("/apps/llm-chat/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    text = page.content.decode()
    assert page.status_code == 200
    assert 'id="app-price"' in text and "1.90 元" in text
    assert "约 5.3 小时" in text or "about 5.3 h" in text
    # Another GPU model and card count: priced again (1 × A800 at 3.50 元).
    other = alice_client.get("/apps/llm-chat/?gpu_model=A800&cards=2")
    assert "7.00 元" in other.content.decode()


def _launch(client: Client, slug: str = "llm-chat", **data: str) -> object:
    return client.post(f"/apps/{slug}/", {"accept_license": "on", **data})


def test_a_launch_orders_an_instance_that_is_ready_when_the_app_answers_and_its_api_takes_its_key(
    world, newcomer, alice_client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    with django_capture_on_commit_callbacks(execute=True):
        response = _launch(alice_client, model="THUDM/chatglm3-6b", gpu_model="RTX4090", cards="1")
    assert response.status_code == 302
    instance = Instance.objects.get(created_by=newcomer, app="llm-chat")
    assert instance.state == InstanceState.RUNNING
    assert (instance.cards, instance.gpu_model.code) == (1, "RTX4090")
    assert instance.app_model == "THUDM/chatglm3-6b"
    assert instance.app_api_key.startswith("sk-gpc-") and len(instance.app_api_key) == 47
    assert instance.image == _chat().image and "server.py" in instance.entrypoint
    assert any(m["target"].startswith("/models/") for m in instance.mounts)
    assert apps.is_ready(instance)
    assert instance.events.filter(code="app_ready").count() == 1
    # The follower reads on from a field kept with the output lines it stored (issue 30).
    kept = instance.events.filter(kind="log", step=apps.LOG_STEP).count()
    assert kept > 0 and instance.output_read == kept
    # The page: Open, the API's base URL, the key and the snippets.
    page = alice_client.get(response["Location"]).content.decode()
    assert 'id="app-open"' in page and instance.app_api_key in page
    assert f"/apps/{instance.public_id}/v1" in page and "from openai import OpenAI" in page
    # The web port is the app's, not the image's JupyterLab.
    assert "open-jupyterlab" not in page and "/web-ports/8000/open/" in page

    base = f"/apps/{instance.public_id}/v1"
    auth = {"HTTP_AUTHORIZATION": f"Bearer {instance.app_api_key}"}
    visitor = Client()
    models = visitor.get(f"{base}/models", **auth)
    assert models.status_code == 200, models
    body = json.loads(_body(models))
    assert body["data"][0]["id"]
    answer = visitor.post(
        f"{base}/chat/completions",
        data=json.dumps(
            {"model": body["data"][0]["id"], "messages": [{"role": "user", "content": "你好"}]}
        ),
        content_type="application/json",
        **auth,
    )
    assert answer.status_code == 200
    reply = json.loads(_body(answer))
    assert reply["choices"][0]["message"]["content"]
    # A wrong key, no key, a key of the page's session only: 401 in OpenAI's error shape.
    for headers in ({"HTTP_AUTHORIZATION": "Bearer sk-gpc-" + "0" * 40}, {}):
        refused = visitor.get(f"{base}/models", **headers)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
    assert alice_client.get(f"{base}/models").status_code == 401
    # Released: the key opens nothing.
    with django_capture_on_commit_callbacks(execute=True):
        release_instance(instance, by="test")
    assert visitor.get(f"{base}/models", **auth).status_code == 401


def test_another_instance_s_key_does_not_open_this_app(
    world, newcomer, alice_client, bob, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    billing.grant_voucher(bob, Decimal("100"), reason="test", valid_days=30)
    with django_capture_on_commit_callbacks(execute=True):
        _launch(alice_client, cards="1")
        bobs = apps.launch_app(bob, _chat(), cards=1, accept_license=True)
    mine = Instance.objects.get(created_by=newcomer, app="llm-chat")
    bobs.refresh_from_db()
    assert bobs.app_api_key != mine.app_api_key
    refused = Client().get(
        f"/apps/{mine.public_id}/v1/models", HTTP_AUTHORIZATION=f"Bearer {bobs.app_api_key}"
    )
    assert refused.status_code == 401
    # Nor does Bob see Alice's instance or key through the API.
    assert APIClient().get(f"/api/v1/instances/{mine.public_id}/").status_code in (401, 403)


def test_the_api_launches_an_app_and_refuses_bad_choices_changing_nothing(
    world, newcomer, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    client = APIClient(HTTP_ACCEPT_LANGUAGE="en")
    client.force_authenticate(newcomer)
    before = Instance.objects.count()
    chinese = client.post(
        "/api/v1/apps/llm-chat/launch/",
        {"model": "gpt2"},
        format="json",
        HTTP_ACCEPT_LANGUAGE="zh-hans",
    )
    assert (
        chinese.status_code == 400 and chinese.json()["detail"] == "请选择这个应用提供的模型之一。"
    )
    for bad, words in (
        ({"model": "gpt2"}, "Choose one of the app's models."),
        ({"gpu_model": "V100"}, "does not run on that GPU model"),
        ({"cards": 3}, "A host has 1, 2, 4 or 8 cards."),
        ({"cards": 16}, "Choose a number of cards this app runs on."),
    ):
        refused = client.post("/api/v1/apps/llm-chat/launch/", bad, format="json")
        assert refused.status_code in (400, 409, 422), refused.content
        assert words in json.dumps(refused.json(), ensure_ascii=False)
    assert Instance.objects.count() == before
    with django_capture_on_commit_callbacks(execute=True):
        made = client.post(
            "/api/v1/apps/llm-chat/launch/",
            {"cards": 1, "accept_license": True},
            format="json",
            HTTP_IDEMPOTENCY_KEY="launch-1",
        )
    assert made.status_code == 202, made.content
    data = made.json()
    assert data["app"]["slug"] == "llm-chat" and data["app"]["api_key"].startswith("sk-gpc-")
    assert data["app"]["api_base_path"] == f"/apps/{data['id']}/v1"
    again = client.post(
        "/api/v1/apps/llm-chat/launch/",
        {"cards": 1, "accept_license": True},
        format="json",
        HTTP_IDEMPOTENCY_KEY="launch-1",
    )
    assert again.status_code == 200 and again.json()["id"] == data["id"]
    shown = client.get(f"/api/v1/instances/{data['id']}/").json()["app"]
    assert shown["state"] == "ready" and shown["open_url"].endswith("/web-ports/8000/open/")


def test_a_gated_model_needs_its_licence_accepted_on_the_app_page(
    world, newcomer, alice_client
) -> None:  # noqa: ANN001
    refused = alice_client.post(
        "/apps/llm-chat/", {"model": "meta-llama/Meta-Llama-3.1-8B-Instruct", "cards": "1"}
    )
    assert refused.status_code == 409
    assert not Instance.objects.filter(created_by=newcomer).exists()


@pytest.mark.parametrize("slug", [a.slug for a in aiapps.read_apps()])
def test_every_app_launches_on_the_simulated_fleet_and_opens_a_labelled_page(
    slug: str, world, alice_client, alice, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    billing.grant_voucher(alice, Decimal("100"), reason="test", valid_days=30)
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(f"/apps/{slug}/", {"accept_license": "on"})
    assert response.status_code == 302, response.content.decode()[:500]
    instance = Instance.objects.get(created_by=alice, app=slug)
    assert instance.state == InstanceState.RUNNING and apps.is_ready(instance)
    app = aiapps.get_app(slug)
    assert app is not None
    page = alice_client.get(f"/instances/{instance.public_id}/").content.decode()
    opened = f"/instances/{instance.public_id}/web-ports/{app.primary_port.port}/open/"
    assert 'id="app-open"' in page and opened in page
    target = alice_client.get(opened)
    assert target.status_code == 302
    body = _body(alice_client.get(target["Location"], HTTP_ACCEPT_LANGUAGE="zh-hans")).decode()
    assert "模拟" in body or "simulated" in body.lower()


def test_an_app_that_does_not_answer_is_warned_about_once_per_start_from_a_field(
    world, newcomer, alice_client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    """Issue 30: the "not answering" warning is told once per start, decided by
    ``app_gave_up_at`` (written with it), not by reading the event log back."""
    with django_capture_on_commit_callbacks(execute=True):
        _launch(alice_client, model="THUDM/chatglm3-6b", gpu_model="RTX4090", cards="1")
    instance = Instance.objects.get(created_by=newcomer, app="llm-chat")
    assert instance.state == InstanceState.RUNNING and instance.app_gave_up_at is None
    # A start whose server never came up (no key: the simulated app answers 503), begun longer
    # ago than the app's patience.
    long_ago = timezone.now() - timedelta(seconds=apps.patience_s(_chat()) + 60)
    Instance.objects.filter(pk=instance.pk).update(
        app_api_key="", access_token="", app_ready_at=None, running_at=long_ago
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert apps.follow_app(instance.pk) == "gave_up"
    warned = instance.events.filter(code="app_not_answering")
    assert warned.count() == 1
    instance.refresh_from_db()
    assert instance.app_gave_up_at is not None and instance.app_gave_up_at >= long_ago
    # Asked again, and with the event rows gone (history for people): not told again.
    warned.delete()
    with django_capture_on_commit_callbacks(execute=True):
        assert apps.follow_app(instance.pk) == "gave_up"
    assert not warned.exists()
    # A later start that does not answer either is told again.
    Instance.objects.filter(pk=instance.pk).update(
        app_gave_up_at=long_ago - timedelta(hours=1), running_at=long_ago
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert apps.follow_app(instance.pk) == "gave_up"
    assert warned.count() == 1
