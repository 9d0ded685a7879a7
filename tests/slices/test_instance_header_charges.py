"""What the instance page's header says an instance costs: 无卡模式 shows no GPUs and only the system
disk's storage charge (not the GPU price), and 关机 says why a stop costs nothing when the system
disk fits in the account's free storage allowance, or the daily figure when it does not."""

from __future__ import annotations

import html as html_lib
import re
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from billing import services as billing
from console.templatetags.console import yuan
from slices.choices import InstanceState
from slices.models import Instance
from slices.services import disks, power
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db

EN = {"HTTP_ACCEPT_LANGUAGE": "en"}


@pytest.fixture
def sim_fleet(sim_fleet: None, settings: Any) -> None:
    settings.SLICES_SYSTEM_DISK_GB = 50
    return sim_fleet


def _page(client: Client, instance: Instance, **headers: str) -> str:
    r = client.get(f"/instances/{instance.public_id}/", **headers)
    assert r.status_code == 200
    return html_lib.unescape(r.content.decode())


def _by_id(page: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>(.*?)</div>', page, re.S)
    assert m, element_id
    return m.group(1)


def _stop_confirmation(page: str) -> str:
    m = re.search(r'id="stop-button" data-confirm="([^"]*)"', page)
    assert m, "no stop button"
    return m.group(1)


def _fill_free_allowance(user: Any) -> Decimal:
    """A cloud disk the size of the free allowance: every further GB is billed. Returns the
    daily charge of a 50 GB system disk then."""
    book = billing.current_price_book()
    disks.create_disk(user, name="fill", size_gb=book.storage_free_gb, region="xiamen")
    return (book.storage_per_gb_day * 50).quantize(Decimal("0.01"))


def _gpuless(user: Any, capture: Any) -> Instance:
    inst = run_order(user, capture, cards=4)
    with capture(execute=True):
        power.stop_instance(inst, by="alice")
    with capture(execute=True):
        power.start_instance(inst, by="alice", mode="gpuless")
    inst.refresh_from_db()
    assert inst.state == InstanceState.RUNNING and inst.gpuless
    return inst


def test_a_gpuless_instance_shows_no_gpus_and_its_storage_charge_within_the_allowance(
    sim_fleet: None, funded: Any, alice_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    inst = _gpuless(funded, django_capture_on_commit_callbacks)
    assert billing.current_price_book().storage_free_gb >= 50
    page = _page(alice_client, inst, **EN)
    gpus = _by_id(page, "instance-gpus")
    assert "No-GPU mode · 0 GPUs" in gpus and "4 × RTX 4090" not in gpus
    assert "Ordered: 4 × RTX 4090" in page  # what a normal start gets, beside it
    rate = _by_id(page, "instance-rate")
    assert "System disk storage only" in rate and "no charge" in rate
    assert yuan(inst.quoted_per_hour) not in rate  # not the GPU price it does not pay
    # The default language marks it the same way (the rate line is the storage one).
    zh = _page(alice_client, inst, HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert 'id="instance-gpus" data-gpuless="1"' in zh
    assert 'id="instance-rate" data-gpuless="1"' in zh
    assert yuan(inst.quoted_per_hour) not in _by_id(zh, "instance-rate")


def test_a_gpuless_instance_over_the_allowance_shows_the_daily_storage_figure(
    sim_fleet: None, funded: Any, alice_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    per_day = _fill_free_allowance(funded)
    inst = _gpuless(funded, django_capture_on_commit_callbacks)
    rate = _by_id(_page(alice_client, inst, **EN), "instance-rate")
    assert f"System disk storage only: {yuan(per_day)} / day" in rate
    # Its stop adds nothing new: the disk is already billed, counted once (not twice).
    confirm = _stop_confirmation(_page(alice_client, inst, **EN))
    assert f"billed as storage: {per_day} 元 a day" in confirm


def test_a_running_instance_shows_its_gpus_and_the_gpu_price(
    sim_fleet: None, funded: Any, alice_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    inst = run_order(funded, django_capture_on_commit_callbacks, cards=4)
    page = _page(alice_client, inst, **EN)
    assert "4 × RTX 4090" in _by_id(page, "instance-gpus")
    assert yuan(inst.quoted_per_hour) in _by_id(page, "instance-rate")
    assert "No-GPU mode" not in page


def test_stop_within_the_free_allowance_says_it_costs_nothing_and_why(
    sim_fleet: None, funded: Any, alice_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    inst = run_order(funded, django_capture_on_commit_callbacks, cards=4)
    free = billing.current_price_book().storage_free_gb
    confirm = _stop_confirmation(_page(alice_client, inst, **EN))
    assert "The 50 GB system disk is kept and is within your free storage allowance" in confirm
    assert f"({free} GB): no charge while stopped" in confirm
    assert "0.00 元 a day" not in confirm
    # Once stopped, the page says the same (not "0.00 元 a day").
    with django_capture_on_commit_callbacks(execute=True):
        power.stop_instance(inst, by="alice")
    stopped = _by_id(_page(alice_client, inst, **EN), "instance-stopped")
    assert "within your free storage allowance" in stopped and "0.00" not in stopped


def test_stop_over_the_free_allowance_states_the_daily_figure(
    sim_fleet: None, funded: Any, alice_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    per_day = _fill_free_allowance(funded)
    inst = run_order(funded, django_capture_on_commit_callbacks, cards=4)
    assert per_day > 0 and power.stopped_cost_per_day(inst) == per_day  # the service's figure
    confirm = _stop_confirmation(_page(alice_client, inst, **EN))
    assert f"billed as storage: {per_day} 元 a day" in confirm
    assert "free storage allowance" not in confirm
    with django_capture_on_commit_callbacks(execute=True):
        power.stop_instance(inst, by="alice")
    stopped = _by_id(_page(alice_client, inst, **EN), "instance-stopped")
    assert f"billed as storage: {per_day} 元 a day" in stopped
