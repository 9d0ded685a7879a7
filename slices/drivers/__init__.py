"""Node drivers: ``get_driver()`` returns the configured one (``SLICES_DRIVER``: sim or ssh)."""

from __future__ import annotations

from django.conf import settings

from slices.drivers.base import DriverError, InstanceSpec, Mount, NodeDriver, NodeTarget, StepResult

__all__ = [
    "DriverError",
    "InstanceSpec",
    "Mount",
    "NodeDriver",
    "NodeTarget",
    "StepResult",
    "get_driver",
]


def get_driver(name: str | None = None) -> NodeDriver:
    """The driver named ``name`` (default: the ``SLICES_DRIVER`` setting), configured from settings."""
    name = name or settings.SLICES_DRIVER
    if name == "sim":
        from slices.drivers.sim import SimDriver  # a driver module is loaded only when chosen

        return SimDriver(time_scale=settings.SIM_TIME_SCALE)
    if name == "ssh":
        from slices.drivers.ssh import SshDriver, SshSettings

        return SshDriver(SshSettings.from_settings(settings))
    raise ValueError(f"unknown node driver {name!r}")
