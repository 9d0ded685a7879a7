"""Channel-layer group names of the live telemetry (ASCII, ``-_.`` only, under 100 characters)."""

from __future__ import annotations


def instance_group(public_id: object) -> str:
    """One instance's samples: its page's charts."""
    return f"telemetry.instance.{public_id}"


def cluster_group(code: str) -> str:
    """One cluster's samples: the operators' heat map and node pages."""
    return f"telemetry.cluster.{code}"
