"""The low-balance decision: who gets warned, which sessions stop. Pure, no Django imports.

Called by the bulk settlement for every wallet with open sessions, *after* charging up to ``now``:

* **Warnings.** For each threshold (seconds of runway, e.g. 3600 = "less than 1 hour left at the
  current burn rate") that the runway is now below and that was not yet warned, one warning.
  Thresholds the runway is back above (after a top-up) are re-armed, so the next dip warns again.
* **Stops.** The balance must cover the next settlement window of the sessions that keep running.
  If it cannot cover all of them, the oldest sessions are kept as long as they fit (a long training
  run is worth more to its owner than the one started a minute ago) and every later one stops *at
  this second*. Because settlements run at least once per window, the balance never falls below
  zero by more than one window of burn (plus one cent of rounding per session), and when ticks are
  late by ``d`` seconds, by at most ``burn × (window + d)``.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from billing.money import SECONDS_PER_HOUR, ZERO, to_decimal
from billing.pricing import runway_seconds

DEFAULT_THRESHOLDS = (3600,)


@dataclass(frozen=True)
class MeteredSession:
    key: Hashable
    burn_per_hour: Decimal  # rate per card-hour × cards
    opened_at: int = 0  # ordering: earlier sessions are kept first; ties by key order given


@dataclass(frozen=True)
class LowBalanceDecision:
    stop: tuple[Hashable, ...]
    warn: tuple[int, ...]  # thresholds (seconds) to warn about now, largest first
    rearm: tuple[int, ...]  # previously warned thresholds the runway is back above
    runway_seconds: int | None  # at the burn rate before any stop; None = nothing burns
    burn_per_hour: Decimal  # before stops


def window_cost(burn_per_hour: Decimal, window_seconds: int) -> Decimal:
    return to_decimal(burn_per_hour) * window_seconds / SECONDS_PER_HOUR


def decide(
    spendable: Decimal,
    sessions: Sequence[MeteredSession],
    window_seconds: int,
    thresholds: Sequence[int] = DEFAULT_THRESHOLDS,
    warned: Collection[int] = (),
) -> LowBalanceDecision:
    """Decide warnings and stops for one wallet whose spendable balance is ``spendable``."""
    spendable = to_decimal(spendable)
    burn = sum((to_decimal(s.burn_per_hour) for s in sessions), ZERO)
    runway = runway_seconds(spendable, burn)
    warn: list[int] = []
    rearm: list[int] = []
    for threshold in sorted(set(thresholds), reverse=True):
        below = runway is not None and runway < threshold
        if below and threshold not in warned:
            warn.append(threshold)
        elif not below and threshold in warned:
            rearm.append(threshold)

    stop: list[Hashable] = []
    if window_cost(burn, window_seconds) > spendable:
        kept = ZERO
        fits = True
        for session in sorted(sessions, key=lambda s: s.opened_at):
            cost = window_cost(session.burn_per_hour, window_seconds)
            # A prefix of the oldest sessions is kept; once one does not fit, all later ones stop,
            # so a cheap new session never outlives an expensive old one.
            if fits and kept + cost <= spendable:
                kept += cost
            else:
                fits = False
                stop.append(session.key)
    return LowBalanceDecision(tuple(stop), tuple(warn), tuple(rearm), runway, burn)


def warning_holds(threshold_seconds: int | None, runway_now: int | None) -> bool:
    """Whether a low-balance warning given at ``threshold_seconds`` of runway still describes the
    account: something burns (``runway_now`` is None when nothing does) and the balance lasts no
    longer than the threshold. A warning from an earlier run, after its instances were released or
    the balance topped up, is history, not a warning."""
    if runway_now is None:
        return False
    return threshold_seconds is None or runway_now <= threshold_seconds
