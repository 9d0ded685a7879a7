"""Mount planning (pure: no database)."""

from __future__ import annotations

import posixpath
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marketplace.catalogue import slug_for
from marketplace.mounts import (
    MAX_MOUNTS,
    AssetRef,
    MountError,
    MountSpec,
    mount_point,
    plan_mounts,
)

LLAMA = AssetRef("model", "meta-llama/Llama-2-7b-hf", "meta-llama--llama-2-7b-hf")
ALPACA = AssetRef("dataset", "tatsu-lab/alpaca", "tatsu-lab--alpaca")
SQUAD = AssetRef("dataset", "squad", "squad")


def test_a_model_is_mounted_read_only_from_the_public_cache() -> None:
    (spec,) = plan_mounts([LLAMA])
    assert spec.source == "/pfs/public/models/meta-llama/Llama-2-7b-hf"
    assert spec.target == "/models/meta-llama--llama-2-7b-hf"
    assert spec.read_only is True
    assert spec.as_dict() == {
        "kind": "model",
        "hub_id": "meta-llama/Llama-2-7b-hf",
        "slug": "meta-llama--llama-2-7b-hf",
        "source": "/pfs/public/models/meta-llama/Llama-2-7b-hf",
        "target": "/models/meta-llama--llama-2-7b-hf",
        "read_only": True,
    }
    assert "ro" in spec.fstab_options.split(",")


def test_a_dataset_without_a_namespace_sits_directly_under_datasets() -> None:
    (spec,) = plan_mounts([SQUAD])
    assert (spec.source, spec.target) == ("/pfs/public/datasets/squad", "/datasets/squad")


def test_models_come_first_and_the_same_asset_twice_is_one_mount() -> None:
    specs = plan_mounts([SQUAD, ALPACA, LLAMA, SQUAD])
    assert [s.target for s in specs] == [
        "/models/meta-llama--llama-2-7b-hf",
        "/datasets/squad",
        "/datasets/tatsu-lab--alpaca",
    ]


def test_two_assets_on_one_mount_point_are_refused() -> None:
    impostor = AssetRef("dataset", "other/squad", "squad")
    with pytest.raises(MountError, match="/datasets/squad"):
        plan_mounts([SQUAD, impostor])


@pytest.mark.parametrize(
    "asset",
    [
        AssetRef("model", "../../etc/passwd", "x"),
        AssetRef("model", "org/..", "x"),
        AssetRef("model", "org/name", "../root"),
        AssetRef("model", "org/name", "a/b"),
        AssetRef("model", "org/name", "UPPER"),
        AssetRef("model", "org/name", "a..b"),
        AssetRef("model", "org/name", ""),
        AssetRef("weights", "org/name", "org--name"),
    ],
)
def test_traversal_bad_slugs_and_unknown_kinds_are_refused(asset: AssetRef) -> None:
    with pytest.raises(MountError):
        plan_mounts([asset])


def test_too_many_mounts_are_refused() -> None:
    assets = [AssetRef("dataset", f"d{i}", f"d{i}") for i in range(MAX_MOUNTS + 1)]
    with pytest.raises(MountError, match=str(MAX_MOUNTS)):
        plan_mounts(assets)


def test_mount_point_stays_inside_its_root() -> None:
    assert mount_point("dataset", "glue") == "/datasets/glue"
    with pytest.raises(MountError):
        mount_point("dataset", ".")


_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
)


@given(hub_id=_TEXT, slug=_TEXT, kind=st.sampled_from(["model", "dataset"]))
@settings(max_examples=400)
def test_no_input_yields_a_mount_outside_its_roots(hub_id: str, slug: str, kind: str) -> None:
    """Whatever text arrives, a spec is either refused or stays inside the PFS cache and the
    asset root, with a target made only of allow-listed characters."""
    try:
        (spec,) = plan_mounts([AssetRef(kind, hub_id, slug)])
    except MountError:
        return
    root = "/models/" if kind == "model" else "/datasets/"
    assert spec.target.startswith(root) and "/" not in spec.target[len(root) :]
    assert posixpath.normpath(spec.source) == spec.source
    assert spec.source.startswith(f"/pfs/public/{kind}s/")
    assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", spec.slug) and ".." not in spec.slug
    assert spec.read_only is True


@given(
    publisher=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True),
    name=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,30}", fullmatch=True),
)
def test_every_valid_hub_id_gets_a_mountable_slug(publisher: str, name: str) -> None:
    hub_id = f"{publisher}/{name}"
    (spec,) = plan_mounts([AssetRef("model", hub_id, slug_for(hub_id))])
    assert spec.source == f"/pfs/public/models/{hub_id}"


def test_a_stored_spec_round_trips_and_is_checked_again() -> None:
    (spec,) = plan_mounts([LLAMA])
    assert MountSpec.from_dict(spec.as_dict()) == spec
    tampered = {**spec.as_dict(), "source": "/etc"}
    with pytest.raises(MountError, match="do not match"):
        MountSpec.from_dict(tampered)
    with pytest.raises(MountError, match="read-only"):
        MountSpec.from_dict({**spec.as_dict(), "read_only": False})
    with pytest.raises(MountError):
        MountSpec.from_dict({"kind": "model"})
