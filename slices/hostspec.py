"""What a host of each GPU model gives an instance besides its GPUs (issue 29): the vCPUs and
memory that come with each card, the NVIDIA driver and the highest CUDA version it supports.

Catalogue data of the fleet (like ``marketplace.catalogue.GPU_LABELS``), pure: the order form
shows it for each offer, and the simulated shell answers ``nproc``, ``free -h`` and
``nvidia-smi`` from the same figures, so what the page promises is what the shell shows. A model
not listed here has no figures (the page says "—", it claims nothing).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostSpec:
    """One GPU model's hosts: what comes with each card, and the host's driver."""

    vcpus_per_gpu: int
    memory_gib_per_gpu: int
    driver: str  # NVIDIA driver version, as nvidia-smi prints it
    cuda: str  # the highest CUDA version the driver runs (nvidia-smi's "CUDA Version")

    def vcpus(self, cards: int) -> int:
        return self.vcpus_per_gpu * max(1, cards)

    def memory_gib(self, cards: int) -> int:
        return self.memory_gib_per_gpu * max(1, cards)


# A card's share of its host: a 4090 host has 128 threads and 512 GiB for 8 cards; an
# A800/H800 HGX host 224 threads (2 × 56-core Xeon, SMT) and 2 TiB.
HOST_SPECS: dict[str, HostSpec] = {
    "RTX4090": HostSpec(vcpus_per_gpu=16, memory_gib_per_gpu=64, driver="550.54.15", cuda="12.4"),
    "A800": HostSpec(vcpus_per_gpu=28, memory_gib_per_gpu=240, driver="550.54.15", cuda="12.4"),
    "H800": HostSpec(vcpus_per_gpu=28, memory_gib_per_gpu=240, driver="550.54.15", cuda="12.4"),
}


def host_spec(gpu_model: str) -> HostSpec | None:
    """The figures for a fleet GPU model code (``"RTX4090"``; spacing and case ignored)."""
    return HOST_SPECS.get("".join(str(gpu_model).split()).upper())
