"""GPU telemetry services: minute rollups in the database, their pruning, an instance's history,
and idle detection (warn the owner; release when they chose that at order time).

The relay (``slices.telemetry.relay``) produces the samples; this module is the only code that
writes ``GpuRollup`` and ``IdleWatch`` rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from console.events import notify_user
from slices.choices import EventKind, EventLevel, InstanceState
from slices.drivers import driver_capabilities
from slices.models import GpuRollup, IdleWatch, Instance
from slices.services.instances import record_event, release_instance
from slices.telemetry.ring import Ring
from slices.telemetry.rollup import IdleVerdict, MinuteOfGpu, RollupRecord, judge_idle
from slices.telemetry.samples import ROW_COLUMNS
from slices.telemetry.store import get_ring

logger = logging.getLogger(__name__)

# The order-time choice (an instance environment variable, set from the order form or the API):
# release the instance once the idle detector judges it idle.
RELEASE_WHEN_IDLE_ENV = "GPC_RELEASE_WHEN_IDLE"


# A rollup keeps the minimum, mean and maximum of these (RollupRecord's triples, GpuRollup's
# <name>_min, <name>_mean and <name>_max fields).
_ROLLUP_STATS = ("util", "mem_used", "temp", "power")
_STAT_PARTS = ("min", "mean", "max")


def _stat_fields(name: str) -> tuple[str, ...]:
    return tuple(f"{name}_{part}" for part in _STAT_PARTS)


def _stat_columns(header: str, field: str) -> tuple[tuple[str, str], ...]:
    """The CSV columns (header, field) of one statistic's minimum, mean and maximum."""
    return tuple(zip(_stat_fields(header), _stat_fields(field), strict=True))


def _when(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def write_rollups(records: Iterable[RollupRecord]) -> int:
    """Insert finished minutes; a minute already written (a relay restarted) is kept as it was."""
    records = list(records)
    ids = {r.instance_id for r in records}
    found = Instance.objects.filter(public_id__in=ids).values_list("public_id", "pk")
    pks: dict[str, int] = {str(public_id): pk for public_id, pk in found}
    rows = [
        GpuRollup(
            instance_id=pks[r.instance_id],
            hostname=r.host[:63],
            gpu=r.gpu,
            minute=_when(r.minute),
            samples=min(r.samples, 32767),
            mem_total=r.mem_total,
            xid_events=r.xid_events,
            simulated=r.simulated,
            **{
                field: value
                for name in _ROLLUP_STATS
                for field, value in zip(_stat_fields(name), getattr(r, name), strict=True)
            },
        )
        for r in records
        if r.instance_id in pks
    ]
    GpuRollup.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
    return len(rows)


def prune_rollups(now: datetime | None = None) -> int:
    """Delete rollups older than ``TELEMETRY_RETENTION_DAYS``; returns how many went."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.TELEMETRY_RETENTION_DAYS)
    deleted, _detail = GpuRollup.objects.filter(minute__lt=cutoff).delete()
    return deleted


# ---------------------------------------------------------------------------------------------
# History
# ---------------------------------------------------------------------------------------------


def instance_history(
    instance: Instance, since: float | None = None, ring: Ring | None = None
) -> dict[str, Any]:
    """What a chart draws at once: the ring's entries after ``since`` and the node names."""
    ring = ring if ring is not None else get_ring()
    hosts = list(instance.nodes.order_by("rank").values_list("hostname", flat=True))
    return {
        "instance": str(instance.public_id),
        "hosts": hosts,
        "columns": list(ROW_COLUMNS),
        "simulated": driver_capabilities(instance.driver or None).simulated,
        "interval": settings.TELEMETRY_INTERVAL,
        "idle": idle_status(instance),
        "entries": ring.since(str(instance.public_id), since),
    }


def idle_status(instance: Instance) -> dict[str, Any] | None:
    """Why the instance is judged idle (in the reader's language), or None while it is not."""
    watch = IdleWatch.objects.filter(instance=instance, idle_since__isnull=False).first()
    if watch is None or not watch.evidence:
        return None
    e = watch.evidence
    params = {
        "gpus": e.get("gpus"),
        "threshold": e.get("threshold"),
        "minutes": e.get("window_minutes"),
        "peak": e.get("peak"),
        "peak_gpu": e.get("peak_gpu"),
        "mem_gib": round(float(e.get("mem_held_mib") or 0) / 1024, 1),
    }
    return {
        "since": watch.idle_since.isoformat() if watch.idle_since else None,
        "text": idle_explanation(params),
        "release": release_when_idle(instance),
        "top": e.get("top", []),
    }


# The CSV export's columns: (header, GpuRollup field); the header names the units.
CSV_COLUMNS: tuple[tuple[str, str], ...] = (
    ("minute_utc", "minute"),
    ("hostname", "hostname"),
    ("gpu", "gpu"),
    ("samples", "samples"),
    *_stat_columns("util", "util"),
    *_stat_columns("mem_used_mib", "mem_used"),
    ("mem_total_mib", "mem_total"),
    *_stat_columns("temp_c", "temp"),
    *_stat_columns("power_w", "power"),
    ("xid_events", "xid_events"),
    ("simulated", "simulated"),
)
CSV_HEADER = tuple(header for header, _field in CSV_COLUMNS)


def history_csv_rows(instance: Instance) -> Iterator[tuple[Any, ...]]:
    """An instance's minute rollups, oldest first, for the CSV export (streamed)."""
    yield CSV_HEADER
    qs = (
        GpuRollup.objects.filter(instance=instance)
        .order_by("minute", "hostname", "gpu")
        .values_list(*(field for _header, field in CSV_COLUMNS))
    )
    for row in qs.iterator(chunk_size=2000):
        yield (row[0].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), *row[1:])


# ---------------------------------------------------------------------------------------------
# Idle detection
# ---------------------------------------------------------------------------------------------


def release_when_idle(instance: Instance) -> bool:
    return str((instance.env or {}).get(RELEASE_WHEN_IDLE_ENV, "")).lower() in {"1", "true", "yes"}


@dataclass(frozen=True)
class IdleDecision:
    instance_id: int
    verdict: IdleVerdict
    warned: bool
    released: bool


def _instance_gpus(instance: Instance) -> list[tuple[str, int]]:
    return [(n.hostname, i) for n in instance.nodes.all() for i in range(32) if n.gpu_mask >> i & 1]


def check_idle(instance: Instance, now: datetime | None = None) -> IdleDecision:
    """Judge one running instance from its last minutes of rollups; warn once per idle spell and
    release it if the owner chose that. A busy minute ends the spell (a new one warns again)."""
    now = now or timezone.now()
    window = settings.TELEMETRY_IDLE_MINUTES
    start = now - timedelta(minutes=window + 1)
    rows = [
        MinuteOfGpu(
            host=h,
            gpu=g,
            minute=int(m.timestamp()),
            util_max=umax,
            util_mean=umean,
            mem_used_max=mem,
        )
        for h, g, m, umax, umean, mem in GpuRollup.objects.filter(
            instance=instance, minute__gte=start
        ).values_list("hostname", "gpu", "minute", "util_max", "util_mean", "mem_used_max")
    ]
    verdict = judge_idle(
        rows,
        gpus=_instance_gpus(instance),
        now=now.timestamp(),
        threshold=settings.TELEMETRY_IDLE_THRESHOLD,
        window_minutes=window,
    )
    return _act_on(instance, verdict, now)


@transaction.atomic
def _act_on(instance: Instance, verdict: IdleVerdict, now: datetime) -> IdleDecision:
    watch, _created = IdleWatch.objects.select_for_update().get_or_create(instance=instance)
    if not verdict.idle:
        if watch.idle_since is not None:
            watch.idle_since = None
            watch.warned_at = None
        watch.evidence = verdict.evidence
        watch.save(update_fields=["idle_since", "warned_at", "evidence", "updated_at"])
        return IdleDecision(instance.pk, verdict, warned=False, released=False)
    assert verdict.since is not None
    watch.idle_since = watch.idle_since or _when(verdict.since)
    watch.evidence = verdict.evidence
    warned = released = False
    release = release_when_idle(instance)
    if watch.warned_at is None:
        # Another beat run got here first when warned_at is set: the row lock makes this once.
        watch.warned_at = now
        warned = True
        params = {
            "threshold": verdict.evidence["threshold"],
            "minutes": verdict.evidence["window_minutes"],
            "gpus": verdict.evidence["gpus"],
            "peak": verdict.evidence["peak"],
            "peak_gpu": verdict.evidence["peak_gpu"],
            "mem_gib": round(verdict.evidence["mem_held_mib"] / 1024, 1),
            "release": release,
        }
        record_event(
            instance, EventKind.STATE, code="idle_warning", params=params, level=EventLevel.WARNING
        )
        transaction.on_commit(lambda: _tell_owner(instance.pk, params))
    if (
        release
        and watch.released_at is None
        and instance.state == InstanceState.RUNNING
        and release_instance(instance, by="idle", code="idle_release")
    ):
        watch.released_at = now
        released = True
    watch.save()
    return IdleDecision(instance.pk, verdict, warned=warned, released=released)


def _tell_owner(instance_id: int, params: dict[str, Any]) -> None:
    """The console notification and the mail, in the console's default language."""
    instance = Instance.objects.select_related("team", "created_by").get(pk=instance_id)
    owner = instance.created_by  # the member who started it hears first
    payload = {"instance": str(instance.public_id), "name": instance.name, **params}
    try:
        notify_user(owner.public_id, "instance.idle", payload)
    except Exception:  # best effort, like every broadcast; the event row is the record
        logger.debug("idle notification dropped", exc_info=True)
    if not owner.email:
        return
    with translation.override(settings.LANGUAGE_CODE):
        subject = _("Your instance %(name)s looks idle") % {"name": instance.name}
        body = idle_explanation(params) + "\n\n"
        if params.get("release"):
            body += _("As you chose when ordering, it is being released now.")
        else:
            body += _("It keeps running and billing until you release it.")
    send_mail(subject, body, None, [owner.email], fail_silently=True)


def idle_explanation(params: dict[str, Any]) -> str:
    """Why the instance was judged idle, in the reader's language."""
    return (
        _(
            "All %(gpus)s GPU(s) stayed below %(threshold)s %% utilisation for the last %(minutes)s "
            "minutes (the busiest, %(peak_gpu)s, peaked at %(peak)s %%). %(mem_gib)s GiB of GPU memory "
            "is still held: a process may be keeping memory without computing."
        )
        % params
    )


def check_idle_instances(now: datetime | None = None) -> list[IdleDecision]:
    """The beat task's body: every running instance, judged one by one."""
    decisions = []
    for instance in Instance.objects.filter(state=InstanceState.RUNNING).prefetch_related("nodes"):
        try:
            decisions.append(check_idle(instance, now))
        except Exception:  # one instance's trouble must not stop the others' checks
            logger.exception("idle check of %s failed", instance.public_id)
    return decisions


# ---------------------------------------------------------------------------------------------
# Fleet snapshot (for /metrics)
# ---------------------------------------------------------------------------------------------


def latest_gpu_samples(
    max_age_seconds: float = 30.0, ring: Ring | None = None
) -> list[dict[str, Any]]:
    """The latest full sample of every GPU of every running instance (stale ones left out)."""
    ring = ring if ring is not None else get_ring()
    cutoff = timezone.now().timestamp() - max_age_seconds
    out: list[dict[str, Any]] = []
    for instance_id, snapshot in ring.latest().items():
        if snapshot.get("ts", 0) < cutoff:
            continue
        for gpu in snapshot.get("gpus", []):
            out.append({**gpu, "instance": instance_id, "simulated": snapshot.get("sim", False)})
    return out
