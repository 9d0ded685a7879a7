"""What the console says must be true (issue 29, from the customers' walk), in Chinese (the
default) and in English: trial claims only while the trial credit lasts; 费用中心 names the billing
section only; the instance page names its image and mounts; the order form states what each card
comes with and offers nothing that cannot be ordered (nor do the home pages count it); the asset
search and a POST-only address opened by hand behave; the simulated fleet tells the truth."""

from __future__ import annotations

import json
import re
import time
from decimal import Decimal
from pathlib import Path

import pytest
from django.test import Client

from billing import clock
from billing import services as billing
from billing.seed import seed_default_prices
from marketplace.models import Asset
from slices.choices import InstanceState
from slices.drivers.base import InstanceSpec, Mount, NodeTarget
from slices.drivers.sim_apps import open_sim_app_tunnel
from slices.drivers.sim_shell import SimShell
from slices.hostspec import host_spec
from slices.models import Instance
from slices.services import terminal
from slices.telemetry.workload import SimWorkload, workload_for
from tests.slices.factories import load_small_fleet, run_order

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
LANGS = ("zh-hans", "en")


@pytest.fixture
def world(full_catalogue, settings) -> None:  # noqa: ANN001
    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    seed_default_prices()
    load_small_fleet()


def _get(client: Client, url: str, lang: str) -> str:
    response = client.get(url, HTTP_ACCEPT_LANGUAGE=lang)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def _spend_trial(user) -> None:  # noqa: ANN001
    """An hour of 8 RTX 4090s (15.20 元) spends the 10.00 元 trial credit (and leaves a debt)."""
    frozen = clock.FrozenClock()
    with clock.use_clock(frozen):
        billing.open_usage_session(
            user, resource_kind="instance", resource_id="spend", gpu_model="RTX 4090", cards=8
        )
        frozen.advance(3600)
        billing.close_usage_session("instance", "spend")
    assert billing.get_wallet_summary(user).trial == 0


# -- trial claims ------------------------------------------------------------------------------
TRIAL_CLAIMS = {
    "zh-hans": ("体验金约可用", "体验金可用", "体验金即可免费运行"),
    "en": ("trial credit: about", "trial credit lasts", "free with the trial credit"),
}


def test_trial_claims_show_while_the_trial_credit_lasts_and_go_once_it_is_spent(
    world, alice, client: Client
) -> None:  # noqa: ANN001
    assert billing.grant_trial_credit(alice)
    client.force_login(alice)
    pages = ("/", "/apps/", "/apps/llm-chat/", "/demo/llama-7b/")
    for lang in LANGS:
        text = "".join(_get(client, url, lang) for url in pages)
        for claim in TRIAL_CLAIMS[lang]:
            assert claim in text, (lang, claim)
    _spend_trial(alice)
    for lang in LANGS:
        for url in pages:
            text = _get(client, url, lang)
            for claim in TRIAL_CLAIMS[lang]:
                assert claim not in text, (lang, url, claim)
        assert 'id="app-trial-hours"' not in _get(client, "/apps/llm-chat/", lang)
    demo = _get(client, "/demo/llama-7b/", "zh-hans")
    assert 'id="demo-trial"' not in demo and "体验金已用完" in demo
    assert "the trial credit is spent" in _get(client, "/demo/llama-7b/", "en")
    # A visitor is told what a new account gets.
    assert "trial credit lasts about" in _get(Client(), "/apps/", "en")


# -- 费用中心 --------------------------------------------------------------------------------------
def test_billing_center_names_the_billing_section_only(world, alice, alice_client) -> None:  # noqa: ANN001
    for app in ("console", "slices", "billing", "marketplace"):
        text = (ROOT / app / "locale/zh_Hans/LC_MESSAGES/django.po").read_text()
        for block in text.split("\n\n"):
            msgid = re.search(r'^msgid ((?:"[^\n]*"\n?)+)', block, re.M)
            msgstr = re.search(r'^msgstr ((?:"[^\n]*"\n?)+)', block, re.M)
            if msgid and msgstr and "费用中心" in msgstr.group(1):
                # Only the section's name, and what leads to it ("Back to billing").
                assert msgid.group(1).strip() in (
                    '"Billing"',
                    '"Back to billing"',
                    '"Open billing"',
                )
    # The billing-mode field and the charge state have words of their own.
    zh = _get(alice_client, "/instances/new/", "zh-hans")
    label = re.search(r'<label class="form-label small" for="id_billing_mode">([^<]*)<', zh)
    assert label and label.group(1) == "计费方式"
    en = _get(alice_client, "/instances/new/", "en")
    assert 'for="id_billing_mode">Billing mode<' in en
    billing.grant_voucher(alice, Decimal("100"), reason="test", valid_days=30)
    billing.open_usage_session(
        alice, resource_kind="instance", resource_id="i-1", gpu_model="RTX 4090", cards=1
    )
    overview = _get(alice_client, "/billing/", "zh-hans")
    assert "计费中" in overview
    assert overview.count("费用中心") == sum(
        1 for _ in re.finditer(r"(<title>|<h1[^>]*>|nav-link[^>]*>)[^<]*费用中心", overview)
    )
    assert "Charging" in _get(alice_client, "/billing/", "en")


# -- the instance page ------------------------------------------------------------------------
def test_the_instance_page_names_its_image_and_its_mounted_models_and_datasets(
    world, alice, alice_client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    from marketplace.services import get_asset_by_hub_id

    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    model = get_asset_by_hub_id("model", "Qwen/Qwen2.5-7B-Instruct")
    dataset = Asset.objects.filter(kind="dataset", license__requires_acceptance=False).first()
    assert dataset is not None
    inst = run_order(
        alice,
        django_capture_on_commit_callbacks,
        cards=1,
        image="pytorch-2.4.1-cuda12.4-py3.11",
        asset_ids=(str(model.public_id), str(dataset.public_id)),
    )
    assert inst.state == InstanceState.RUNNING
    for lang, words in (
        ("zh-hans", ("镜像", "模型", "数据集")),
        ("en", ("Image", "Models", "Datasets")),
    ):
        html = _get(alice_client, f"/instances/{inst.public_id}/", lang)
        card = re.search(r'id="instance-software".*?</dl>', html, re.S).group(0)
        for word in words:
            assert word in card, (lang, word)
        assert "pytorch-2.4.1-cuda12.4-py3.11" in card and inst.container in card
        assert model.hub_id in card and dataset.hub_id in card
        assert model.get_absolute_url() in card and dataset.get_absolute_url() in card
        for m in inst.mounts:
            assert m["target"] in card


# -- the order form and the home pages ---------------------------------------------------------
def test_the_order_form_states_what_each_card_comes_with(world, alice_client) -> None:  # noqa: ANN001
    spec = host_spec("RTX4090")
    assert spec is not None
    for lang, words in (
        ("zh-hans", ("vCPU", "内存", "系统盘", "数据盘", "驱动 / CUDA")),
        ("en", ("vCPUs", "Host memory", "System disk", "Data disk", "Driver / CUDA")),
    ):
        html = _get(alice_client, "/instances/new/?gpu_model=RTX4090&cards=2", lang)
        host = re.search(r'id="order-host".*?</dl>', html, re.S).group(0)
        for word in words:
            assert word in host, (lang, word)
        assert re.search(rf'id="order-vcpus">{spec.vcpus(2)}<', host)
        assert re.search(rf'id="order-memory">{spec.memory_gib(2)} GiB<', host)
        assert "50 GB" in host and spec.driver in host and f"CUDA {spec.cuda}" in host
        offers = re.search(r'id="order-offers".*?</table>', html, re.S).group(0)
        for code in ("RTX4090", "A800"):
            row = re.search(rf'data-gpu-model="{code}">.*?</tr>', offers, re.S).group(0)
            figures = host_spec(code)
            assert (
                f">{figures.vcpus_per_gpu}<" in row and f"{figures.memory_gib_per_gpu} GiB" in row
            )


def test_a_model_that_cannot_be_ordered_is_not_offered_as_available_nor_counted(
    world, alice_client
) -> None:  # noqa: ANN001
    # The seed price book has the H800 as the operator's placeholder: not orderable.
    for lang, closed in (("zh-hans", "暂未开放"), ("en", "not yet available")):
        html = _get(alice_client, "/instances/new/", lang)
        option = re.search(r'<option value="H800"[^>]*>([^<]*)<', html)
        assert option and closed in option.group(1)
        assert 'data-gpu-model="H800"' not in html  # no host figures promised for it
        home = _get(alice_client, "/", lang)
        table = re.search(r'id="availability".*?</table>', home, re.S).group(0)
        assert "H800" not in table
    landing = _get(Client(), "/", "en")
    assert "H800" not in re.search(r"cards \(([^)]*)\)", landing).group(1)
    cards = int(re.search(r"([\d,]+) cards \(", landing).group(1).replace(",", ""))
    from slices.models import Node

    orderable = sum(n.gpus_per_node for n in Node.objects.exclude(gpu_model__code="H800"))
    assert cards == orderable


# -- the asset search and POST-only addresses ---------------------------------------------------
def test_the_asset_search_sends_only_its_query_and_the_choices(world, alice_client) -> None:  # noqa: ANN001
    html = _get(alice_client, "/instances/new/?gpu_model=RTX4090&cards=1", "en")
    search = re.search(r'<form method="get" action="/instances/new/" id="asset-search"[^>]*>', html)
    assert search  # a form of its own, outside the order form
    button = re.search(r'<button[^>]*id="asset-search-button"[^>]*>', html).group(0)
    assert 'form="asset-search"' in button
    box = re.search(r'<input[^>]*name="asset_q"[^>]*>', html).group(0)
    assert 'form="asset-search"' in box
    # What the search form carries: its query box and hidden copies of the choices, never the
    # CSRF token nor the order's fields (name, key, billing mode...).
    members = re.findall(r'<(?:input|select|button)[^>]*form="asset-search"[^>]*>', html)
    names = {re.search(r'name="([^"]*)"', m).group(1) for m in members if 'name="' in m}
    assert names <= {"asset_q", "region", "gpu_model", "cards", "image", "disk_gb", "assets"}
    assert "csrfmiddlewaretoken" not in names
    # htmx leaves the token out of the addresses it pushes; a GET that carries it is sent on
    # to the same choices without it.
    assert 'hx-params="not csrfmiddlewaretoken"' in html
    leaked = alice_client.get("/instances/new/?gpu_model=RTX4090&csrfmiddlewaretoken=abc&cards=1")
    assert leaked.status_code == 302
    assert "csrfmiddlewaretoken" not in leaked["Location"]
    assert "gpu_model=RTX4090" in leaked["Location"] and "cards=1" in leaked["Location"]


def test_a_post_only_address_opened_by_hand_gets_a_page(
    world, alice, alice_client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    inst = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    for lang, heading in (("zh-hans", "这个地址是表单提交的目标"), ("en", "where a form is sent")):
        for url in (f"/instances/{inst.public_id}/stop/", f"/instances/{inst.public_id}/release/"):
            response = alice_client.get(url, HTTP_ACCEPT_LANGUAGE=lang)
            if response.status_code != 405:
                continue  # a page of its own (a confirmation form), already a page
            html = response.content.decode()
            assert "<html" in html and heading in html, url
            assert f'href="/instances/{inst.public_id}/"' in html
            assert "POST" in response["Allow"]
    stop = alice_client.get(f"/instances/{inst.public_id}/stop/")
    assert stop.status_code == 405 and b'id="holding-page"' in stop.content
    # The API keeps DRF's JSON 405.
    api = alice_client.delete("/api/v1/apps/")
    assert api.status_code == 405 and api["Content-Type"].startswith("application/json")


# -- the simulated fleet ----------------------------------------------------------------------
def test_a_host_nothing_runs_on_reads_idle_and_a_recipe_run_reads_busy() -> None:
    assert workload_for({}) == "idle"
    assert workload_for({"RECIPE": "llama-lora"}) == "training"
    assert workload_for({"SIM_WORKLOAD": "failing"}) == "failing"
    idle = SimWorkload("i-1", "h", 0, (0, 1), workload=workload_for({}), gpu_model="RTX4090")
    assert max(idle.gpu(0, float(t))["util_gpu"] for t in range(300)) <= 1


def _shell(spec: InstanceSpec, gpus: tuple[int, ...] = (0, 1)) -> SimShell:
    node = NodeTarget(
        hostname="xm-4090-r01-n01", address="10.0.0.1", port=22, host_key="", rank=0, gpus=gpus
    )
    return SimShell(spec, node, gpu_model="RTX4090", time_scale=0.0)


def _run(shell: SimShell, line: str) -> str:
    shell.recv(0)
    shell.send(line.encode() + b"\r")
    out = b""
    while (chunk := shell.recv(0.05)) not in (None, b""):
        out += chunk
    return out.decode()


def _spec(**kw) -> InstanceSpec:  # noqa: ANN003
    base = {
        "instance_id": "00000000-0000-0000-0000-000000000001",
        "slug": "gpc-00000000",
        "name": "box",
        "owner": "o",
        "image": "",
        "entrypoint": "",
        "env": {},
        "mounts": (),
        "ssh_public_key": "",
        "nodes": (),
        "gpus_per_node": 2,
    }
    return InstanceSpec(**{**base, **kw})


def test_the_simulated_shell_agrees_with_the_image_the_host_and_its_mounts(
    world, alice, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    inst = run_order(
        alice, django_capture_on_commit_callbacks, cards=2, image="pytorch-2.4.1-cuda12.4-py3.11"
    )
    grant = terminal.authorize(alice, inst.public_id, 0)
    software = dict(grant.spec.software)
    assert software == {
        "framework": "PyTorch 2.4.1",
        "python": "3.11",
        "cuda": "12.4",
        "torch": "2.4.1",
    }
    shell = _shell(grant.spec, grant.node.gpus)
    assert "Python 3.11" in _run(shell, "python --version")
    assert "release 12.4" in _run(shell, "nvcc --version")
    assert _run(shell, "python -c 'import torch; print(torch.__version__)'").count("2.4.1+cu124")
    smi = _run(shell, "nvidia-smi")
    spec = host_spec("RTX4090")
    assert f"Driver Version: {spec.driver}" in smi and f"CUDA Version: {spec.cuda}" in smi
    assert "No running processes found" in smi  # nothing runs on it: idle
    assert _run(shell, "nproc").split()[1] == str(spec.vcpus(2))
    assert f"{spec.memory_gib(2)}Gi" in _run(shell, "free -h")
    # A bare host has no PyTorch, and says so.
    bare = _shell(_spec())
    assert "No module named 'torch'" in _run(bare, "python train.py")
    # ls /models agrees with df -h.
    mounted = _shell(
        _spec(mounts=(Mount("/pfs/c/m", "/models/qwen-7b"), Mount("/pfs/c/d", "/datasets/alpaca")))
    )
    df = _run(mounted, "df -h")
    assert "/models/qwen-7b" in df and "/datasets/alpaca" in df
    assert "qwen-7b" in _run(mounted, "ls /models")
    assert "alpaca" in _run(mounted, "ls /datasets")
    assert "models" in _run(mounted, "ls /")
    assert "No such file" not in _run(mounted, "cd /models")


def test_the_chat_stand_in_refuses_a_model_it_does_not_serve() -> None:
    env = {"GPC_APP_API_KEY": "k", "APP_MODEL_NAME": "Qwen/Qwen2.5-7B-Instruct"}

    def chat(model: str) -> tuple[int, dict]:
        sock = open_sim_app_tunnel("llm-chat", 8000, env)
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        sock.sendall(
            (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n{body}"
            ).encode()
        )
        data = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (chunk := sock.recv(65536)):
            data += chunk
        sock.close()
        head, _, payload = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(payload)

    status, reply = chat("gpt-4o")
    assert status == 404 and reply["error"]["code"] == "model_not_found"
    assert "gpt-4o" in reply["error"]["message"]
    status, reply = chat("Qwen/Qwen2.5-7B-Instruct")
    assert status == 200 and reply["model"] == "Qwen/Qwen2.5-7B-Instruct"


def test_the_demo_labels_its_ssh_command_simulated(
    world, alice, alice_client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    from console.services import add_ssh_key

    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl a@b"
    add_ssh_key(alice, name="laptop", public_key=key, make_default=True)
    inst = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    assert Instance.objects.get(pk=inst.pk).driver == "sim"
    for lang, word in (("zh-hans", "模拟集群"), ("en", "simulated fleet")):
        html = _get(alice_client, f"/instances/{inst.public_id}/", lang)
        note = re.search(r'id="instance-ssh-simulated".*?</div>', html, re.S)
        assert note and word in note.group(0) and ".example" in note.group(0)
        assert 'data-simulated="1"' in html
    api = alice_client.get(f"/api/v1/instances/{inst.public_id}/")
    assert api.json()["ssh"]["simulated"] is True


# -- one SSH address for the instance's life (the database side; the real hosts in
#    test_ssh_stable_endpoint.py) ---------------------------------------------------------------
def test_the_shipped_fleet_forwards_ports_and_a_bad_range_is_refused() -> None:
    from slices.fleetfile import SHIPPED_FLEET, FleetFileError, load_fleet_file, parse_fleet
    from tests.slices.factories import SMALL_FLEET

    spec = load_fleet_file(SHIPPED_FLEET)
    assert all(r.gateway is not None and r.gateway.ports == "40000-49999" for r in spec.regions)
    with_ports = SMALL_FLEET.replace(
        "name_zh: 厦门\n",
        "name_zh: 厦门\n    gateway: {host: gw.example.com, address: 10.0.0.2, "
        "ports: 40000-40009}\n",
        1,
    )
    assert [r.gateway.ports for r in parse_fleet(with_ports).regions if r.gateway] == [
        "40000-40009"
    ]
    for bad in ("40009-40000", "80-90", "40000", "a-b"):
        with pytest.raises(FleetFileError, match="ports"):
            parse_fleet(with_ports.replace("40000-40009", bad))


def test_the_routes_file_is_plain_and_sorted() -> None:
    from slices.agent.gateway_forward import parse_routes
    from slices.drivers.base import DriverError, GatewayRoute
    from slices.drivers.gateway import routes_file

    text, count = routes_file(
        [
            GatewayRoute(40017, "10.11.1.3", 30211, "gpc-6f3a2b1c"),
            GatewayRoute(40001, "fd00::1", 30000),
        ]
    )
    assert count == 2
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == ["40001 fd00::1 30000 -", "40017 10.11.1.3 30211 gpc-6f3a2b1c"]
    assert parse_routes(text) == {40001: ("fd00::1", 30000), 40017: ("10.11.1.3", 30211)}
    for bad in (
        GatewayRoute(40017, "10.0.0.1; rm -rf /", 22),
        GatewayRoute(0, "10.0.0.1", 22),
        GatewayRoute(40017, "10.0.0.1", 70000),
        GatewayRoute(40017, "10.0.0.1", 22, "a b"),
    ):
        with pytest.raises(DriverError):
            routes_file([bad])
    with pytest.raises(DriverError):
        routes_file([GatewayRoute(40017, "10.0.0.1", 22), GatewayRoute(40017, "10.0.0.2", 22)])


def test_the_gateway_port_is_kept_through_stop_start_and_migration_and_freed_at_release(
    world, alice, alice_client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    from slices import services
    from slices.models import Gateway, Node, Region
    from slices.services import access, migration, power

    region = Region.objects.get(code="xiamen")
    gw = Gateway.objects.create(
        region=region, host="gw-xiamen.example.com", address="10.0.0.2", ports="40000-40003"
    )
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    inst = run_order(alice, django_capture_on_commit_callbacks, cards=8)
    port = inst.gateway_port
    assert port is not None and 40000 <= port <= 40003
    command = f"ssh -p {port} root@gw-xiamen.example.com"
    assert access.ssh_access(inst).command == command
    routes = access.gateway_routes(gw)
    assert [(r.port, r.address) for r in routes] == [(port, inst.nodes.get().node.address)]
    # The running event says the same command.
    assert inst.events.filter(code="running").last().params["ssh"] == command

    first = inst.nodes.get().node
    with django_capture_on_commit_callbacks(execute=True):
        power.stop_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.gateway_port == port and access.gateway_routes(gw) == ()
    services.change_node_state(first, "drain", "test")
    with django_capture_on_commit_callbacks(execute=True):
        power.start_instance(inst, by="alice")
    inst.refresh_from_db()
    second = inst.nodes.get().node
    assert second.pk != first.pk and inst.gateway_port == port
    assert access.ssh_access(inst).command == command
    assert [r.address for r in access.gateway_routes(gw)] == [second.address]

    services.change_node_state(first, "return", "test")
    with django_capture_on_commit_callbacks(execute=True):
        assert migration.fail_node(Node.objects.get(pk=second.pk), "test", "gone")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING, list(inst.events.values_list("code", "text"))
    third = inst.nodes.get().node
    assert third.pk != second.pk and inst.gateway_port == port
    assert access.ssh_access(inst).command == command
    for lang, word in (("zh-hans", "地址都不变"), ("en", "the address stays the same")):
        html = _get(alice_client, f"/instances/{inst.public_id}/", lang)
        assert command in html and word in html

    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(inst, by="alice")
    inst.refresh_from_db()
    assert inst.gateway_port is None
    assert port not in [r.port for r in access.gateway_routes(gw)]


def test_a_full_port_range_leaves_the_next_instance_on_ssh_j(
    world, alice, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    from slices.models import Gateway, Region
    from slices.services import access

    Gateway.objects.create(
        region=Region.objects.get(code="xiamen"),
        host="gw-xiamen.example.com",
        address="10.0.0.2",
        ports="40000-40000",
    )
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    first = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    second = run_order(alice, django_capture_on_commit_callbacks, cards=1)
    assert first.gateway_port == 40000 and second.gateway_port is None
    assert access.ssh_access(first).command == "ssh -p 40000 root@gw-xiamen.example.com"
    assert access.ssh_access(second).jump == "gpc@gw-xiamen.example.com"


def test_the_availability_api_says_what_can_be_ordered_and_what_a_card_comes_with(
    world, alice_client
) -> None:  # noqa: ANN001
    rows = alice_client.get("/api/v1/availability/").json()
    by_model = {r["gpu_model"]: r for r in rows}
    assert by_model["H800"]["orderable"] is False  # the seed's placeholder price
    assert by_model["RTX4090"]["orderable"] is True
    spec = host_spec("RTX4090")
    assert by_model["RTX4090"]["host"] == {
        "vcpus_per_gpu": spec.vcpus_per_gpu,
        "memory_gib_per_gpu": spec.memory_gib_per_gpu,
        "driver": spec.driver,
        "cuda": spec.cuda,
    }
