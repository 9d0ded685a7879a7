"""The driver registry (issue 31): every driver is made from its entry, and declares exactly what
it implements, so code can ask the declaration instead of probing the driver."""

from __future__ import annotations

import pytest

from slices.drivers import capabilities, driver_capabilities, get_driver
from slices.drivers.registry import DRIVERS

# What each declared ability needs the driver to have.
NEEDS = {
    "terminal": ("open_shell",),
    "web_ports": ("open_tunnel",),
    "stop": ("stop",),
    "migration": ("move_disk", "probe"),
    "workload_output": ("workload_output",),
    "slurm": ("start_slurm", "slurm_request", "slurm_output", "slurm_paths"),
}


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_each_driver_has_what_it_declares(name: str, settings) -> None:  # noqa: ANN001
    driver = get_driver(name)
    assert driver.name == name
    declared = capabilities(name)
    assert declared.simulated == driver.simulated
    for ability, methods in NEEDS.items():
        if getattr(declared, ability):
            assert all(callable(getattr(driver, m, None)) for m in methods), (name, ability)
    if declared.telemetry == "driver":
        assert callable(getattr(driver, "telemetry", None))


def test_the_configured_driver_and_an_unknown_one(settings) -> None:  # noqa: ANN001
    settings.SLICES_DRIVER = "sim"
    assert driver_capabilities().simulated and not capabilities("ssh").simulated
    with pytest.raises(ValueError, match="unknown node driver"):
        get_driver("nope")
