"""A recipe's progress from its structured log lines (pure: no Django).

A recipe (``marketplace/recipes/*/train.py``) prints one JSON object per line among its plain
output, each with an ``event``:

- ``start``: run, world_size, device, max_steps, resumed_from (a step or null)
- ``progress``: step, max_steps, loss, tokens_per_s, eta_s, elapsed_s
- ``checkpoint``: step, path (as the instance sees it: ``/pfs/checkpoints/<run>/step-<N>``)
- ``done``: step, loss, adapter (``/pfs/adapters/<run>``), reason (``max_steps``/``time_limit``)

The console keeps every output line as a log event of the instance; ``summarise`` turns them into
what the instance page shows (step, loss curve, ETA, checkpoints, where the adapter is) and what
tells the console that the run is over. Anything else (a malformed line, an unknown event, a
non-finite number) is ignored: a recipe's output is untrusted text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

EVENTS = frozenset({"start", "progress", "checkpoint", "done"})
MAX_LINE = 4000
MAX_PATH = 300
CURVE_POINTS = 200


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _count(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number >= 0 else None


def _path(value: Any) -> str:
    text = str(value) if isinstance(value, str) else ""
    return text if text.startswith("/") and len(text) <= MAX_PATH and ".." not in text else ""


def parse_line(text: str) -> dict[str, Any] | None:
    """The structured event on one output line, or None for plain output."""
    line = text.strip()
    if not line.startswith("{") or len(line) > MAX_LINE:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("event") not in EVENTS:
        return None
    return data


@dataclass
class RunProgress:
    """What a recipe's output says so far."""

    run: str = ""
    world_size: int | None = None
    device: str = ""
    step: int = 0
    max_steps: int | None = None
    loss: float | None = None
    first_loss: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    elapsed_s: float | None = None
    resumed_from: int | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    checkpoints: list[tuple[int, str]] = field(default_factory=list)
    done: bool = False
    done_reason: str = ""
    adapter: str = ""
    simulated: bool = False
    started: bool = False

    @property
    def percent(self) -> int:
        if self.done:
            return 100
        if not self.max_steps:
            return 0
        return max(0, min(100, int(100 * self.step / self.max_steps)))

    @property
    def last_checkpoint(self) -> str:
        return self.checkpoints[-1][1] if self.checkpoints else ""

    def curve(self, width: int = 320, height: int = 80) -> str:
        """The loss curve as SVG polyline points (at most ``CURVE_POINTS``), scaled to the box."""
        points = self.losses
        if len(points) > CURVE_POINTS:
            stride = len(points) / CURVE_POINTS
            points = [points[int(i * stride)] for i in range(CURVE_POINTS)] + [points[-1]]
        if len(points) < 2:
            return ""
        s0, s1 = points[0][0], points[-1][0]
        lo = min(v for _, v in points)
        hi = max(v for _, v in points)
        span_x = (s1 - s0) or 1
        span_y = (hi - lo) or 1.0
        return " ".join(
            f"{(s - s0) / span_x * width:.1f},{height - (v - lo) / span_y * height:.1f}"
            for s, v in points
        )

    def add(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if event.get("simulated") is True:
            self.simulated = True
        if kind == "start":
            self.started = True
            self.run = str(event.get("run", ""))[:100]
            self.world_size = _count(event.get("world_size"))
            self.device = str(event.get("device", ""))[:20]
            self.max_steps = _count(event.get("max_steps")) or self.max_steps
            self.resumed_from = _count(event.get("resumed_from"))
            if self.resumed_from is not None:
                self.step = max(self.step, self.resumed_from)
        elif kind == "progress":
            step = _count(event.get("step"))
            loss = _number(event.get("loss"))
            if step is None:
                return
            self.step = step
            self.max_steps = _count(event.get("max_steps")) or self.max_steps
            self.tokens_per_s = _number(event.get("tokens_per_s"))
            self.eta_s = _number(event.get("eta_s"))
            self.elapsed_s = _number(event.get("elapsed_s"))
            if loss is not None:
                self.loss = loss
                if self.first_loss is None:
                    self.first_loss = loss
                self.losses.append((step, loss))
        elif kind == "checkpoint":
            step = _count(event.get("step"))
            path = _path(event.get("path"))
            if step is not None and path:
                self.checkpoints.append((step, path))
        elif kind == "done":
            self.done = True
            self.done_reason = str(event.get("reason", ""))[:40]
            self.adapter = _path(event.get("adapter"))
            step = _count(event.get("step"))
            if step is not None:
                self.step = step
            loss = _number(event.get("loss"))
            if loss is not None:
                self.loss = loss
            self.eta_s = 0.0


def summarise(lines: Iterable[str]) -> RunProgress:
    """Fold a recipe's output lines, in order, into its progress."""
    progress = RunProgress()
    for text in lines:
        event = parse_line(text)
        if event is not None:
            progress.add(event)
    return progress
