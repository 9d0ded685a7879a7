"""Loading shipped files into the database (the fleet file, the marketplace catalogue): create or
update one row by its natural key, and the report of what a load changed. Both loaders are
idempotent: a second load of the same file finds every row unchanged."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from django.db.models import Model

Outcome = Literal["created", "updated", "unchanged"]


def _counts() -> dict[str, int]:
    return defaultdict(int)


@dataclass
class LoadReport:
    """How many rows of each kind (``what``) a load created, updated or found unchanged."""

    created: dict[str, int] = field(default_factory=_counts)
    updated: dict[str, int] = field(default_factory=_counts)
    unchanged: dict[str, int] = field(default_factory=_counts)

    def add(self, what: str, outcome: Outcome, n: int = 1) -> None:
        if not n:
            return
        bucket: dict[str, int] = getattr(self, outcome)
        bucket[what] = bucket.get(what, 0) + n

    def summary(self) -> str:
        whats = sorted({*self.created, *self.updated, *self.unchanged})
        return "; ".join(
            f"{w}: {self.created.get(w, 0)} created, {self.updated.get(w, 0)} updated, "
            f"{self.unchanged.get(w, 0)} unchanged"
            for w in whats
        )


def update_changed(obj: Model, values: dict[str, Any]) -> bool:
    """Set and save (only) the fields of ``obj`` whose value differs from ``values``; says whether
    any did."""
    changed = [k for k, v in values.items() if getattr(obj, k) != v]
    if not changed:
        return False
    for k in changed:
        setattr(obj, k, values[k])
    obj.save(update_fields=changed)
    return True


def upsert(
    model: type[Model], lookup: dict[str, Any], values: dict[str, Any]
) -> tuple[Any, Outcome]:
    """Create or update one row by ``lookup``; says whether it was created, updated or unchanged."""
    obj = model._default_manager.filter(**lookup).first()
    if obj is None:
        return model._default_manager.create(**lookup, **values), "created"
    return obj, "updated" if update_changed(obj, values) else "unchanged"


def upsert_counted(
    report: LoadReport,
    what: str,
    model: type[Model],
    lookup: dict[str, Any],
    values: dict[str, Any],
) -> Any:
    """``upsert``, counted in ``report`` under ``what``; returns the row."""
    obj, outcome = upsert(model, lookup, values)
    report.add(what, outcome)
    return obj
