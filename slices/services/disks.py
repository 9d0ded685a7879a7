"""Persistent cloud disks: create, resize up, delete, attach to several instances, and the storage
charge (README "Storage and resilience").

A disk lives in one region and outlives every instance it is attached to; it may be attached to
any number of the owner's instances in its region at once, each read-write or read-only. Releasing
an instance detaches its disks; a disk attached to a live instance cannot be deleted.

Storage is billed per account through billing's disk meter: one usage session per account
(``resource_kind="storage"``, the account's public id) for the GB of its disks plus the system disks
of its stopped instances; billing takes the price book's free GB off and charges the rest per
GB-day. When the total changes the session is closed and reopened at the new size (settled to the
second), so the free quota counts once per account, not once per disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext_noop

from billing import services as billing
from billing.choices import Meter
from console.api.compiled import CompiledQuery, Many
from console.audit import services as audit
from console.errors import DomainError, ErrorCode
from console.ids import uuid_or_404
from console.models import Team
from console.names import NameRefused, clean_name
from console.tenancy import for_row, team_of, user_of
from slices.choices import DiskMode, DiskState, EventKind, InstanceState
from slices.models import Disk, DiskAttachment, Instance, PfsUsage, Region
from slices.services.history import record_event

STORAGE_RESOURCE = "storage"
# Instances whose system disk is kept and billed as storage.
DISK_KEPT_STATES = (InstanceState.STOPPING, InstanceState.STOPPED, InstanceState.STARTING)
# Disks may be attached to instances in these states (not to ones on their way out).
ATTACHABLE_STATES = (
    InstanceState.PENDING,
    InstanceState.ALLOCATING,
    InstanceState.PROVISIONING,
    InstanceState.RUNNING,
    InstanceState.STOPPING,
    InstanceState.STOPPED,
    InstanceState.STARTING,
    InstanceState.MIGRATING,
)


class DiskRefused(DomainError):
    """A disk request that cannot be done as asked (nothing changed)."""

    code = ErrorCode.INVALID
    http_status = 400


class DiskInUse(DomainError):
    """The disk is attached to a live instance."""

    code = ErrorCode.CONFLICT
    http_status = 409


# ---------------------------------------------------------------------------------------------
# Fetchers
# ---------------------------------------------------------------------------------------------


def get_disk_for_user(user: Any, public_id: Any) -> Disk:
    """The caller's live disk, or 404 (another customer's disk does not exist for them)."""
    pid = uuid_or_404(public_id)
    disk = Disk.objects.for_team(user).live().select_related("region").filter(public_id=pid).first()
    if disk is None:
        raise Http404
    return disk


def attachments_of(disk: Disk) -> list[DiskAttachment]:
    return list(
        disk.attachments.filter(detached_at__isnull=True)
        .select_related("instance")
        .order_by("attached_at", "id")
    )


# ---------------------------------------------------------------------------------------------
# Storage charge
# ---------------------------------------------------------------------------------------------


def _account_id(who: Any) -> str:
    """The storage session's resource id: the team's /pfs key (a personal team's is its
    account's public id, as before teams)."""
    return team_of(who).pfs_key


def _lock_account(user: Any) -> PfsUsage:
    """Serialise one account's storage changes (its PFS usage row is the lock)."""
    row, _created = PfsUsage.objects.get_or_create(team=team_of(user))
    return PfsUsage.objects.select_for_update().get(pk=row.pk)


# A 无卡模式 start's system disk is billed as storage while it is placed or runs.
GPULESS_DISK_STATES = (InstanceState.PROVISIONING, InstanceState.RUNNING)


def storage_gb(user: Any) -> tuple[int, int]:
    """(GB of the account's live disks, GB of the system disks kept by its stopped instances)."""
    disks = Disk.objects.for_team(user).live().aggregate(n=Sum("size_gb"))["n"] or 0
    system = (
        Instance.objects.for_team(user)
        .filter(Q(state__in=DISK_KEPT_STATES) | Q(gpuless=True, state__in=GPULESS_DISK_STATES))
        .aggregate(n=Sum("system_disk_gb"))["n"]
        or 0
    )
    return int(disks), int(system)


def storage_price() -> billing.StoragePrice:
    """The price book's storage price (billing's)."""
    return billing.storage_price()


@dataclass(frozen=True)
class StorageSummary:
    disks_gb: int
    system_gb: int
    free_gb: int
    per_gb_day: Decimal
    per_day: Decimal

    @property
    def total_gb(self) -> int:
        return self.disks_gb + self.system_gb


def storage_summary(user: Any) -> StorageSummary:
    disks, system = storage_gb(user)
    price = storage_price()
    return StorageSummary(
        disks, system, price.free_gb, price.per_gb_day, price.per_day(disks + system)
    )


def disk_counted(instance: Instance) -> bool:
    """Whether storage already bills this instance's system disk: kept while stopped, or in use
    by a 无卡模式 start (``storage_gb`` counts both)."""
    return instance.state in DISK_KEPT_STATES or (
        instance.gpuless and instance.state in GPULESS_DISK_STATES
    )


def kept_disk_per_day(instance: Instance) -> Decimal:
    """What keeping this instance's system disk adds to the account's storage charge per day
    (counted once, whether or not storage bills it already)."""
    disks, system = storage_gb(instance.team)
    price = storage_price()
    total = disks + system + (0 if disk_counted(instance) else instance.system_disk_gb)
    return price.added_per_day(total, instance.system_disk_gb)


def sync_storage_billing(user: Any) -> None:
    """Make the account's storage session bill exactly its current GB (close and reopen on change).

    Called in the transaction of every change of the total, with the account lock held.
    """
    disks, system = storage_gb(user)
    total = disks + system
    price = storage_price()
    billable = max(0, total - price.free_gb)
    rid = _account_id(user)
    current = _open_session(rid)
    # The session carries the total GB (billing takes the free allowance off): compare that, or
    # every sync would close and reopen it.
    if current is not None and current.cards == total and billable > 0:
        return
    now = timezone.now()
    if current is not None:
        billing.close_usage_session(STORAGE_RESOURCE, rid, at=now)
    if billable > 0 and billing.current_price_book() is not None:
        billing.open_usage_session(
            team_of(user),  # the team's shared storage: no member's (a personal team's person)
            resource_kind=STORAGE_RESOURCE,
            resource_id=rid,
            cards=total,
            meter=Meter.DISK,
            label=f"{total} GB",
            at=now,
        )


def _open_session(resource_id: str) -> Any:
    return billing.get_open_session(STORAGE_RESOURCE, resource_id)


# ---------------------------------------------------------------------------------------------
# Disks
# ---------------------------------------------------------------------------------------------


def _check_size(size_gb: Any) -> int:
    try:
        size = int(size_gb)
    except (TypeError, ValueError):
        size = 0
    if not 1 <= size <= int(settings.SLICES_DISK_MAX_GB):
        raise DiskRefused(
            gettext_noop("A disk has between 1 and %(max)d GB."),
            max=int(settings.SLICES_DISK_MAX_GB),
        )
    return size


def _check_funds(user: Any, added_gb: int) -> None:
    """Refuse a disk whose first day of storage the balance cannot pay, or that the acting
    member's monthly budget cannot carry (billing decides both)."""
    disks, system = storage_gb(user)
    billing.ensure_storage_affordable(user, disks + system, added_gb)
    added = storage_price().added_per_day(disks + system + added_gb, added_gb)
    if added > 0:  # within the free allowance a disk costs nothing: no budget to check
        billing.ensure_member_within_budget(user, storage_per_day=added)


def _lock_team(who: Any) -> None:
    """The team's lock first (the order of every order, start and budget change; issue 30)."""
    Team.objects.select_for_update().filter(pk=team_of(who).pk).values_list("pk").first()


@transaction.atomic
def create_disk(user: Any, *, name: str, size_gb: Any, region: str, request: Any = None) -> Disk:
    size = _check_size(size_gb)
    try:
        name = clean_name(name)  # the rules every customer-chosen name follows (console/names.py)
    except NameRefused as exc:
        raise DiskRefused(exc.template, field=exc.field, **exc.params) from None
    if not name:
        raise DiskRefused(gettext_noop("Give the disk a name."), field="name")
    region_row = Region.objects.filter(code=region).first()
    if region_row is None:
        raise DiskRefused(gettext_noop("Unknown region %(region)s."), region=region)
    _lock_team(user)
    _lock_account(user)
    limit = int(settings.SLICES_DISK_MAX_PER_ACCOUNT)
    if Disk.objects.for_team(user).live().count() >= limit:
        raise DiskRefused(
            gettext_noop("An account may have at most %(max)d disks; delete one first."),
            code=ErrorCode.QUOTA_EXCEEDED,
            http_status=409,
            max=limit,
        )
    _check_funds(user, size)
    disk = Disk.objects.create(
        team=team_of(user), created_by=user_of(user), region=region_row, name=name, size_gb=size
    )
    sync_storage_billing(user)
    audit.record(user, "disk.create", disk, after={"size_gb": size, "region": region}, request=request)  # fmt: skip
    return disk


@transaction.atomic
def resize_disk(disk: Disk, size_gb: Any, *, who: Any = None, request: Any = None) -> Disk:
    """Grow a disk (never shrink: the file system on it would lose data). ``who`` acts (its
    member's budget is checked); default: the disk's maker in its team."""
    size = _check_size(size_gb)
    who = who if who is not None else for_row(disk)
    _lock_team(disk.team)
    _lock_account(disk.team)
    disk.refresh_from_db()
    if disk.state != DiskState.AVAILABLE:
        raise Http404
    if size <= disk.size_gb:
        raise DiskRefused(
            gettext_noop("A disk only grows: choose more than %(size)d GB."), size=disk.size_gb
        )
    _check_funds(who, size - disk.size_gb)
    audit.record(who, "disk.resize", disk, before={"size_gb": disk.size_gb}, after={"size_gb": size}, request=request)  # fmt: skip
    Disk.objects.filter(pk=disk.pk).update(size_gb=size)
    disk.size_gb = size
    for att in attachments_of(disk):
        _event(att.instance, "disk_resized", disk, size=size)
    sync_storage_billing(disk.team)
    return disk


@transaction.atomic
def delete_disk(disk: Disk, *, who: Any = None, request: Any = None) -> None:
    """Delete a disk that no live instance uses (its storage charge stops now)."""
    _lock_account(disk.team)
    in_use = [a.instance for a in attachments_of(disk) if a.instance.state in ATTACHABLE_STATES]
    if in_use:
        raise DiskInUse(
            gettext_noop(
                "The disk %(disk)s is attached to %(count)d instance(s) (%(names)s); detach it or "
                "release them first."
            ),
            disk=disk.name,
            count=len(in_use),
            names=", ".join(i.name for i in in_use),
        )
    now = timezone.now()
    won = Disk.objects.filter(pk=disk.pk, state=DiskState.AVAILABLE).update(
        state=DiskState.DELETED, deleted_at=now
    )
    if not won:
        raise Http404
    DiskAttachment.objects.filter(disk=disk, detached_at__isnull=True).update(detached_at=now)
    disk.state = DiskState.DELETED
    audit.record(who, "disk.delete", disk, before={"size_gb": disk.size_gb, "state": "available"}, request=request)  # fmt: skip
    sync_storage_billing(disk.team)


@transaction.atomic
def attach_disk(disk: Disk, instance: Instance, mode: str = DiskMode.READ_WRITE) -> DiskAttachment:
    """Attach ``disk`` to one more instance of its owner in its region (read-write or read-only)."""
    if mode not in DiskMode.values:
        raise DiskRefused(gettext_noop("A disk is attached read-write (rw) or read-only (ro)."))
    _lock_account(disk.team)
    disk.refresh_from_db()
    if disk.state != DiskState.AVAILABLE or instance.team_id != disk.team_id:
        raise Http404
    instance.refresh_from_db()
    if instance.state not in ATTACHABLE_STATES:
        raise DiskRefused(
            gettext_noop("A disk cannot be attached to an instance that is %(state)s."),
            code=ErrorCode.CONFLICT,
            http_status=409,
            state=instance.get_state_display(),
        )
    if instance.region_id is not None and instance.region_id != disk.region_id:
        raise DiskRefused(
            gettext_noop(
                "The disk %(disk)s is in %(disk_region)s and the instance in %(region)s: a disk "
                "attaches only to instances in its region."
            ),
            disk=disk.name,
            disk_region=disk.region.display_name,
            region=instance.region.display_name if instance.region else "",
        )
    try:
        with transaction.atomic():
            att = DiskAttachment.objects.create(disk=disk, instance=instance, mode=mode)
    except IntegrityError:
        raise DiskRefused(
            gettext_noop("The disk %(disk)s is already attached to this instance."),
            code=ErrorCode.CONFLICT,
            http_status=409,
            disk=disk.name,
        ) from None
    _event(instance, "disk_attached", disk, mode=mode)
    return att


@transaction.atomic
def detach_disk(disk: Disk, instance: Instance) -> bool:
    won = DiskAttachment.objects.filter(
        disk=disk, instance=instance, detached_at__isnull=True
    ).update(detached_at=timezone.now())
    if won:
        _event(instance, "disk_detached", disk)
    return bool(won)


def detach_all(instance: Instance) -> int:
    """An instance was released: its disks stay, detached (called in the release transaction)."""
    return DiskAttachment.objects.filter(instance=instance, detached_at__isnull=True).update(
        detached_at=timezone.now()
    )


def instance_disks(instance: Instance) -> list[DiskAttachment]:
    return instances_disks([instance])[instance.pk]


# The API reads it on every poll of an instance: its SQL built once per process.
_ATTACHED_TO = CompiledQuery(
    lambda ids: (
        DiskAttachment.objects.filter(instance__in=ids, detached_at__isnull=True)
        .select_related("disk")
        .order_by("attached_at", "id")
    ),
    ids=Many(DiskAttachment._meta.get_field("instance")),
)


def instances_disks(instances: Iterable[Instance]) -> dict[int, list[DiskAttachment]]:
    """The attached disks of each instance, by instance pk, in one query (a page of the API)."""
    out: dict[int, list[DiskAttachment]] = {i.pk: [] for i in instances}
    for attachment in _ATTACHED_TO.all(ids=list(out)):
        out[attachment.instance_id].append(attachment)
    return out


# ---------------------------------------------------------------------------------------------
# Attach at order time
# ---------------------------------------------------------------------------------------------


def resolve_for_order(
    user: Any, refs: tuple[tuple[str, str], ...] | list[Any], region: str
) -> tuple[str, list[tuple[Disk, str]]]:
    """The disks an order names (public id, mode), checked; and the region they pin the order to."""
    out: list[tuple[Disk, str]] = []
    for ref in refs:
        pid, mode = (ref, DiskMode.READ_WRITE) if isinstance(ref, str) else (ref[0], ref[1])
        if mode not in DiskMode.values:
            raise DiskRefused(
                gettext_noop("A disk is attached read-write (rw) or read-only (ro)."), field="disks"
            )
        try:
            disk = get_disk_for_user(user, pid)
        except Http404:
            raise DiskRefused(
                gettext_noop("Unknown disk %(disk)s."), field="disks", disk=str(pid)[:64]
            ) from None
        if any(d.pk == disk.pk for d, _m in out):
            continue
        out.append((disk, mode))
    regions = {d.region.code for d, _m in out}
    if len(regions) > 1 or (region and regions and regions != {region}):
        raise DiskRefused(
            gettext_noop("The disks and the instance must all be in one region."), field="disks"
        )
    return (region or (regions.pop() if regions else "")), out


def attach_for_order(instance: Instance, disks: list[tuple[Disk, str]]) -> None:
    for disk, mode in disks:
        attach_disk(disk, instance, mode)


def _event(instance: Instance, code: str, disk: Disk, **params: Any) -> None:
    record_event(
        instance,
        EventKind.STATE,
        code=code,
        params={
            "disk": disk.name,
            "disk_id": str(disk.public_id),
            "path": disk.mount_path,
            **params,
        },
    )
