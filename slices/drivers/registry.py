"""The node drivers, by name, and what each can do (Healthchecks' ``TRANSPORTS``: kind → class).

Code that needs a driver's ability asks its declaration (``capabilities(name).slurm``), never
``hasattr(driver, ...)`` nor the driver's name. A driver module is imported only when the driver
is made (``make``), so the sim's modules never load paramiko and the ssh driver's never load the
simulated fleet. Adding a driver is one entry here and its module (ARCHITECTURE.md).

No Django here: ``make`` takes the settings object from the caller.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Capabilities:
    """What a driver can do beyond provisioning and teardown (``base.NodeDriver``)."""

    simulated: bool  # the simulated fleet: pages and figures say so
    terminal: bool  # ``open_shell``: the web terminal (``base.AccessDriver``)
    web_ports: bool  # ``open_tunnel``: the console's proxy to an instance's web ports
    telemetry: str  # "driver": its own ``telemetry``; "agent": the NVML agent over SSH; "" none
    stop: bool  # ``stop``: 关机 keeping the system disk (``base.StopDriver``)
    migration: bool  # ``move_disk`` and ``probe``: start elsewhere, replace a failed node
    gpuless_start: bool  # 无卡模式: a start with no GPU at all
    workload_output: bool  # ``workload_output``: what the workload printed (recipes, apps)
    slurm: bool  # ``start_slurm``, ``slurm_request``, ``slurm_output`` (``slices.slurm``)


@dataclass(frozen=True)
class DriverEntry:
    name: str
    target: str  # "<module>:<class>", imported when the driver is made
    capabilities: Capabilities

    def make(self, settings: Any) -> Any:
        module, _, attr = self.target.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        return cls.from_settings(settings)


DRIVERS: dict[str, DriverEntry] = {
    "sim": DriverEntry(
        "sim",
        "slices.drivers.sim:SimDriver",
        Capabilities(
            simulated=True,
            terminal=True,
            web_ports=True,
            telemetry="driver",
            stop=True,
            migration=True,
            gpuless_start=True,
            workload_output=True,
            slurm=True,
        ),
    ),
    "ssh": DriverEntry(
        "ssh",
        "slices.drivers.ssh:SshDriver",
        Capabilities(
            simulated=False,
            terminal=True,
            web_ports=True,
            telemetry="agent",
            stop=True,
            migration=True,
            gpuless_start=True,
            workload_output=True,
            slurm=True,  # on the bare-process runtime (the test hosts) for now: README "Slurm"
        ),
    ),
}


def entry(name: str) -> DriverEntry:
    try:
        return DRIVERS[name]
    except KeyError:
        raise ValueError(f"unknown node driver {name!r}") from None


def capabilities(name: str) -> Capabilities:
    """What the driver called ``name`` can do (ValueError for an unknown name)."""
    return entry(name).capabilities
