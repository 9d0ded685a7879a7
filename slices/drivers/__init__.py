"""Node drivers: ``get_driver()`` returns the configured one (``SLICES_DRIVER``), made from the
registry (``slices.drivers.registry``: each driver by name, with what it can do)."""

from __future__ import annotations

from django.conf import settings

from slices.drivers.base import DriverError, InstanceSpec, Mount, NodeDriver, NodeTarget, StepResult
from slices.drivers.registry import Capabilities, capabilities, entry

__all__ = [
    "Capabilities",
    "DriverError",
    "InstanceSpec",
    "Mount",
    "NodeDriver",
    "NodeTarget",
    "StepResult",
    "capabilities",
    "driver_capabilities",
    "get_driver",
]


def get_driver(name: str | None = None) -> NodeDriver:
    """The driver named ``name`` (default: the ``SLICES_DRIVER`` setting), configured from settings."""
    driver: NodeDriver = entry(name or settings.SLICES_DRIVER).make(settings)
    return driver


def driver_capabilities(name: str | None = None) -> Capabilities:
    """What the driver named ``name`` (default: the configured one) can do."""
    return capabilities(name or settings.SLICES_DRIVER)
