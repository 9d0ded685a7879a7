"""A slice's nodes start together: every node's first step is on its way before the drive records
anything. (Recording each node's share of the instance-wide "isolate" before submitting its
first step held node k's start behind k records: bench/provisioning.py saw the eighth node of a
64-card slice start up to 100 ms after the first on this machine.)"""

from __future__ import annotations

import threading
from typing import Any

from django.db.models.signals import post_save

from slices import services
from slices.drivers.sim import SimDriver
from slices.models import InstanceEvent
from slices.services import provisioning


class _CountingDriver(SimDriver):
    """The simulated driver, counting the nodes whose first step (connect) has begun."""

    def __init__(self) -> None:
        super().__init__(time_scale=0)
        self.connecting = 0
        self.changed = threading.Condition()

    def connect(self, spec: Any, node: Any, log: Any) -> Any:
        with self.changed:
            self.connecting += 1
            self.changed.notify_all()
        return super().connect(spec, node, log)


def test_every_node_of_a_slice_is_connecting_before_the_first_step_is_recorded(
    funded, sim_fleet, django_capture_on_commit_callbacks
) -> None:
    driver = _CountingDriver()
    at_first_record: list[int] = []

    def on_event(sender: Any, instance: InstanceEvent, created: bool, **kwargs: Any) -> None:
        if instance.code == "step_done" and not at_first_record:
            # The first node's "isolate" being recorded: how many nodes are connecting by now?
            # (Waits for all of them, up to a bound: the old order never got past one.)
            with driver.changed:
                driver.changed.wait_for(lambda: driver.connecting == 8, timeout=10)
                at_first_record.append(driver.connecting)

    with django_capture_on_commit_callbacks(execute=False):
        instance, _ = services.order_instance(
            funded, services.OrderRequest(gpu_model="A800", cards=64)
        )
    post_save.connect(on_event, sender=InstanceEvent)
    try:
        assert provisioning.provision_instance(instance.pk, driver=driver) == "running"
    finally:
        post_save.disconnect(on_event, sender=InstanceEvent)
    assert at_first_record == [8]
    # ... and every node's steps were still recorded once each, in order.
    steps = list(
        instance.events.filter(code="step_done").order_by("pk").values_list("node", "step")
    )
    for node in {n for n, _ in steps}:
        assert [s for n, s in steps if n == node] == [
            "isolate",
            "connect",
            "prepare",
            "mount",
            "start",
            "health",
        ]
