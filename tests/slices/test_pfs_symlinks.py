"""The console host never follows a symlink a tenant plants in their PFS directory (SECURITY.md;
issue 29: checkpoint discovery followed one). Real directories and real symlinks on a temporary
PFS root, the driver module as the console uses it (``slices.drivers.pfs.LocalPfs``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slices.drivers.pfs import INCOMPLETE, LocalPfs

ALICE, BOB = "alice-0001", "bob-0002"


@pytest.fixture
def pfs(tmp_path: Path) -> LocalPfs:
    pfs = LocalPfs(tmp_path / "pfs")
    pfs.create(ALICE)
    pfs.create(BOB)
    return pfs


def _step(pfs: LocalPfs, owner: str, run: str, step: int, *, mtime: float = 1_700_000_000) -> Path:
    path = pfs.root / owner / "checkpoints" / run / f"step-{step}"
    path.mkdir(parents=True)
    (path / "state.json").write_text("{}")
    os.utime(path, (mtime, mtime))
    return path


def test_a_planted_step_link_is_not_a_checkpoint(pfs: LocalPfs) -> None:
    """Alice links ``step-9`` to Bob's checkpoint: her latest whole checkpoint is still her own."""
    _step(pfs, ALICE, "run", 3)
    bobs = _step(pfs, BOB, "run", 5, mtime=1_800_000_000)
    (pfs.root / ALICE / "checkpoints" / "run" / "step-9").symlink_to(bobs)
    found = pfs.latest_checkpoint(ALICE, "run")
    assert found is not None
    assert (found.step, found.path) == (3, "/pfs/checkpoints/run/step-3")
    assert found.at.timestamp() == 1_700_000_000


def test_a_planted_run_or_checkpoints_link_finds_nothing(pfs: LocalPfs, tmp_path: Path) -> None:
    _step(pfs, BOB, "run", 5)
    mine = pfs.root / ALICE / "checkpoints"
    (mine / "run").symlink_to(pfs.root / BOB / "checkpoints" / "run")
    assert pfs.latest_checkpoint(ALICE, "run") is None
    (mine / "run").unlink()
    mine.rmdir()
    mine.symlink_to(pfs.root / BOB / "checkpoints")
    assert pfs.latest_checkpoint(ALICE, "run") is None
    # A link to a host folder shaped like checkpoints: nothing either.
    host = tmp_path / "host" / "run" / "step-7"
    host.mkdir(parents=True)
    mine.unlink()
    mine.symlink_to(tmp_path / "host")
    assert pfs.latest_checkpoint(ALICE, "run") is None
    assert pfs.latest_checkpoint(BOB, "run") is not None  # Bob's own is found


def test_an_incomplete_marker_that_is_a_link_still_marks_the_step_incomplete(
    pfs: LocalPfs,
) -> None:
    _step(pfs, ALICE, "run", 3)
    newer = _step(pfs, ALICE, "run", 4)
    (newer / INCOMPLETE).symlink_to("/nonexistent")
    found = pfs.latest_checkpoint(ALICE, "run")
    assert found is not None and found.step == 3


def test_usage_counts_a_link_as_a_link_and_create_writes_through_none(
    pfs: LocalPfs, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * 100_000)
    home = pfs.root / ALICE
    (home / "mine.txt").write_bytes(b"y" * 10)
    (home / "to-dir").symlink_to(outside)
    (home / "to-file").symlink_to(outside / "big")
    usage = pfs.measure(ALICE)
    assert usage.files == 3
    assert usage.bytes == 10 + len(str(outside)) + len(str(outside / "big"))
    # A ``checkpoints`` replaced by a dangling link: create makes nothing through it, and fails not.
    (home / "checkpoints").rmdir()
    target = tmp_path / "made-through-the-link"
    (home / "checkpoints").symlink_to(target)
    pfs.create(ALICE)
    assert not target.exists()
    assert (home / "checkpoints").is_symlink()


def test_an_account_directory_that_is_a_link_is_neither_measured_nor_searched(
    pfs: LocalPfs,
) -> None:
    _step(pfs, BOB, "run", 5)
    (pfs.root / "carol-0003").symlink_to(pfs.root / BOB)
    assert pfs.measure("carol-0003").files == 0
    assert pfs.latest_checkpoint("carol-0003", "run") is None
