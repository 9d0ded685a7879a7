"""Mount specifications for marketplace assets. No Django imports.

Every asset lives once on the parallel file system's public cache, under
``/pfs/public/models/<publisher>/<name>`` (datasets: ``/pfs/public/datasets/...``), and is bind-mounted
**read-only** into every node of an instance at ``/models/<slug>`` or ``/datasets/<slug>``. Nothing is
downloaded at run time. The provisioning drivers receive a list of :class:`MountSpec` (or its
``as_dict()``) and apply it; this module only decides and validates what to mount where.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from marketplace.catalogue import DATASET, MODEL, is_valid_hub_id, is_valid_slug

PFS_PUBLIC_ROOT = "/pfs/public"
SOURCE_ROOTS = {MODEL: f"{PFS_PUBLIC_ROOT}/models", DATASET: f"{PFS_PUBLIC_ROOT}/datasets"}
MOUNT_ROOTS = {MODEL: "/models", DATASET: "/datasets"}
# More mounts than this on one instance is a mistake, not a workload.
MAX_MOUNTS = 32


class MountError(ValueError):
    """The requested mounts are not acceptable; the message says which asset and why."""


@dataclass(frozen=True)
class AssetRef:
    """What the mount planner needs to know about one asset."""

    kind: str
    hub_id: str
    slug: str


@dataclass(frozen=True)
class MountSpec:
    """One read-only bind mount: ``source`` on the PFS cache -> ``target`` inside every node."""

    kind: str
    hub_id: str
    slug: str
    source: str
    target: str
    read_only: bool = True

    def as_dict(self) -> dict[str, str | bool]:
        return {
            "kind": self.kind,
            "hub_id": self.hub_id,
            "slug": self.slug,
            "source": self.source,
            "target": self.target,
            "read_only": self.read_only,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MountSpec:
        """Rebuild a spec stored as JSON (e.g. on an instance) and check it again: a row edited
        in the database must not be able to mount anything but the PFS cache, read-only."""
        try:
            spec = mount_spec(AssetRef(str(data["kind"]), str(data["hub_id"]), str(data["slug"])))
        except (KeyError, TypeError) as exc:
            raise MountError(f"not a mount specification: {data!r}") from exc
        if (data.get("source"), data.get("target")) != (spec.source, spec.target):
            raise MountError(f"{spec.hub_id}: stored paths do not match the asset")
        if data.get("read_only") is not True:
            raise MountError(f"{spec.hub_id}: marketplace mounts are read-only")
        return spec

    @property
    def fstab_options(self) -> str:
        """The options a driver passes to ``mount --bind`` (remounted ro, no suid/dev/exec)."""
        return "bind,ro,nosuid,nodev,noexec"


def _inside(path: str, root: str) -> bool:
    normal = posixpath.normpath(path)
    return normal == path and normal.startswith(root + "/")


def source_path(kind: str, hub_id: str) -> str:
    """Where the asset lives on the PFS public cache: ``/pfs/public/models/<publisher>/<name>``."""
    if kind not in SOURCE_ROOTS:
        raise MountError(f"unknown asset kind {kind!r}")
    if not is_valid_hub_id(hub_id):
        raise MountError(f"{hub_id!r} is not a valid hub id")
    path = f"{SOURCE_ROOTS[kind]}/{hub_id}"
    if not _inside(path, SOURCE_ROOTS[kind]):  # belt and braces: the hub id rule forbids ".."
        raise MountError(f"{hub_id!r} escapes the public cache")
    return path


def mount_point(kind: str, slug: str) -> str:
    """Where the asset appears inside the node: ``/models/<slug>`` or ``/datasets/<slug>``."""
    if kind not in MOUNT_ROOTS:
        raise MountError(f"unknown asset kind {kind!r}")
    if not is_valid_slug(slug):
        raise MountError(f"{slug!r} is not a valid slug (a-z, 0-9, '.', '_', '-')")
    path = f"{MOUNT_ROOTS[kind]}/{slug}"
    if not _inside(path, MOUNT_ROOTS[kind]):
        raise MountError(f"{slug!r} escapes {MOUNT_ROOTS[kind]}")
    return path


def mount_spec(asset: AssetRef) -> MountSpec:
    return MountSpec(
        kind=asset.kind,
        hub_id=asset.hub_id,
        slug=asset.slug,
        source=source_path(asset.kind, asset.hub_id),
        target=mount_point(asset.kind, asset.slug),
    )


def plan_mounts(assets: Iterable[AssetRef]) -> list[MountSpec]:
    """Validate and order the mounts of one instance (models first, then datasets, by slug).

    Refuses an invalid hub id or slug, two assets on the same mount point, and more than
    ``MAX_MOUNTS`` assets. Asking for the same asset twice is one mount.
    """
    specs: dict[str, MountSpec] = {}
    for asset in assets:
        spec = mount_spec(asset)
        existing = specs.get(spec.target)
        if existing is not None:
            if existing.source == spec.source:
                continue
            raise MountError(
                f"{spec.hub_id} and {existing.hub_id} would both be mounted at {spec.target}"
            )
        specs[spec.target] = spec
    if len(specs) > MAX_MOUNTS:
        raise MountError(f"at most {MAX_MOUNTS} assets can be mounted on one instance")
    return sorted(specs.values(), key=lambda s: (s.kind != MODEL, s.target))
