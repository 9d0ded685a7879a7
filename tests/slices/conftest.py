"""Fixtures shared by the slices tests that order instances on the simulated fleet."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest

from billing import services as billing
from console.models import User
from tests.slices.factories import load_small_fleet


@pytest.fixture
def sim_driver(settings) -> Iterator[None]:
    """The simulated driver, its steps instant and retried at once; every simulated node answers
    again afterwards (``SimDriver.silence``)."""
    from slices.drivers.sim import SimDriver

    settings.SIM_TIME_SCALE = 0
    settings.SLICES_DRIVER = "sim"
    settings.SLICES_RETRY_BACKOFF_SECONDS = 0
    yield
    SimDriver.revive()


@pytest.fixture
def sim_fleet(sim_driver) -> None:
    """The small fleet on the simulated driver, steps instant and retried at once."""
    load_small_fleet()


@pytest.fixture
def funded(alice: User) -> User:
    """Alice with a 5,000 元 voucher: enough for any order of these tests."""
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    return alice
