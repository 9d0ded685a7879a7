"""Jobs on a slice's Slurm (issue 31): submit, the cached queue, output, cancel, job mode.

The console reaches slurmrestd only through the driver (its pinned SSH connection to rank 0),
with a JWT it mints per request for the instance's user (``slurmconf.mint_jwt``). slurmrestd is
stateless and synchronous, so the pages and the API read ``SlurmJob`` rows, the cached queue,
refreshed on events: after a submit or a cancel, and by the follower
(``slices.tasks.follow_slurm_jobs_task``) every ``SLURM_FOLLOW_INTERVAL`` while a job is live;
it reads their output too (from /pfs, over the same connection). Jobs submitted in the terminal
(``sbatch``) show up at the next refresh.

Job mode: the order's job is submitted once the slice runs; with ``release_on_job_end`` the
slice is released when it ends, so billing runs from running to the job's end.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.http import Http404
from django.utils import timezone
from django.utils.translation import gettext_noop

from console.errors import DomainError, ErrorCode
from console.ids import parse_uuid
from slices import events, slurmconf
from slices.choices import EventKind, EventLevel, InstanceState, JobGroup
from slices.drivers import DriverError, get_driver
from slices.drivers.slurm import SlurmDriver
from slices.errors import InstanceConflict, OrderRefused
from slices.models import Instance, SlurmCluster, SlurmJob
from slices.services import slurm
from slices.services.history import record_event
from slices.services.instances import release_instance
from slices.services.jobs import enqueue, enqueue_on_commit
from slices.services.provisioning import build_spec

logger = logging.getLogger(__name__)

OUTPUT_KEEP = 64 * 1024  # the output's tail kept per job (the whole file stays on /pfs)
OUTPUT_READ = 32 * 1024  # read per job per refresh
FOLLOW_TASK = "slices.tasks.follow_slurm_jobs_task"


class SlurmNotReady(InstanceConflict):
    """The instance has no Slurm, or it is not running yet."""


class SlurmUnreachable(DomainError):
    """The slice's slurmrestd did not answer (its rank 0 unreachable, the daemon gone)."""

    code = ErrorCode.ERROR
    http_status = 502


def _unreachable(exc: DriverError) -> SlurmUnreachable:
    return SlurmUnreachable(
        gettext_noop("The slice's Slurm could not be reached: %(error)s"),
        error=(exc.detail or exc.code)[:300],
    )


def _ready_cluster(instance: Instance) -> SlurmCluster:
    cluster = slurm.cluster_of(instance)
    if cluster is None:
        raise SlurmNotReady(gettext_noop("This instance runs no Slurm."))
    if instance.state != InstanceState.RUNNING or cluster.started_at is None:
        raise SlurmNotReady(gettext_noop("Slurm runs once the instance is running."))
    return cluster


def _token(cluster: SlurmCluster) -> str:
    return slurmconf.mint_jwt(
        bytes(cluster.jwt_key), str(settings.SLICES_INSTANCE_SSH_USER), int(time.time())
    )


class _Link:
    """One instance's Slurm as the console reaches it: the driver, the spec, the setup."""

    def __init__(self, instance: Instance, cluster: SlurmCluster, driver: Any = None) -> None:
        self.instance, self.cluster = instance, cluster
        # A driver that declares ``slurm`` (slices.drivers.registry) implements SlurmDriver.
        self.driver: SlurmDriver = driver or cast(SlurmDriver, get_driver(instance.driver or None))
        self.spec = build_spec(instance)
        self.setup = slurm.setup_for(instance, cluster)
        self.api = slurmconf.api(cluster.api_version)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.driver.slurm_request(
            self.spec, self.setup, method, path, body, _token(self.cluster)
        )


def get_job(instance: Instance, public_id: Any) -> SlurmJob:
    """One job of the instance (the caller fetched the instance with its permission check)."""
    pid = parse_uuid(public_id)
    job = SlurmJob.objects.filter(instance=instance, public_id=pid).first() if pid else None
    if job is None:
        raise Http404
    return job


def list_jobs(instance: Instance) -> list[SlurmJob]:
    """The cached queue, newest first (no call to Slurm)."""
    return list(SlurmJob.objects.filter(instance=instance).order_by("-created_at", "-id")[:200])


def submit_job(
    instance: Instance,
    user: Any,
    raw: dict[str, Any],
    *,
    driver: Any = None,
    from_order: bool = False,
) -> SlurmJob:
    """Submit a job (data: script, name, nodes, gpus_per_node, time_limit, environment) to the
    slice's Slurm over slurmrestd; the row is the queue's cache. Raises ``OrderRefused`` for a
    bad job, ``SlurmNotReady``, or ``DriverError`` when Slurm refused or could not be reached."""
    cluster = _ready_cluster(instance)
    job = slurm.clean_job(raw, nodes=instance.nodes.count())
    link = _Link(instance, cluster, driver)
    paths = link.driver.slurm_paths(link.spec, link.setup)
    req = slurmconf.JobRequest(
        script=job["script"],
        name=job["name"],
        nodes=job["nodes"],
        gpus_per_node=job["gpus_per_node"],
        time_limit_min=job["time_limit"],
        environment=job["environment"],
    )
    body = link.api.submit_body(
        req, paths.jobs, f"{paths.jobs}/slurm-%j.out", str(settings.SLICES_NODE_PATH)
    )
    try:
        answer = link.call("POST", link.api.submit_path(), body)
    except DriverError as exc:
        raise _unreachable(exc) from None
    slurm_id = link.api.submitted_id(answer.body)
    if answer.status >= 400 or slurm_id is None:
        errors = "; ".join(link.api.errors(answer.body)) or f"HTTP {answer.status}"
        raise OrderRefused(
            gettext_noop("Slurm refused the job: %(error)s"), field="script", error=errors[:300]
        )
    with transaction.atomic():
        row, _created = SlurmJob.objects.update_or_create(
            instance=instance,
            slurm_id=slurm_id,
            defaults={
                "name": job["name"],
                "script": job["script"],
                "nodes": job["nodes"],
                "gpus_per_node": job["gpus_per_node"],
                "time_limit_min": job["time_limit"],
                "environment": job["environment"],
                "submitted_by": user,
                "from_order": from_order,
            },
        )
        record_event(
            instance,
            EventKind.STATE,
            code="job_submitted",
            params={"name": row.name, "slurm_id": slurm_id, "user": _who(user)},
        )
        enqueue_on_commit(FOLLOW_TASK, instance.pk)
    # The cache follows the event at once (its state and pending reason), not a poll later.
    try:
        refresh_queue(instance, driver=link.driver)
    except DriverError as exc:
        logger.info("the queue of %s was not read after a submit: %s", instance.public_id, exc)
    row.refresh_from_db()
    return row


def _who(user: Any) -> str:
    return user.get_username() if user is not None else "console"


def cancel_job(job: SlurmJob, user: Any, *, driver: Any = None) -> SlurmJob:
    """Cancel a queued or running job (idempotent: a job already done stays as it ended)."""
    instance = job.instance
    cluster = _ready_cluster(instance)
    if job.group == JobGroup.DONE or job.slurm_id is None:
        return job
    link = _Link(instance, cluster, driver)
    try:
        answer = link.call("DELETE", link.api.job_path(job.slurm_id))
        if answer.status >= 400:
            errors = "; ".join(link.api.errors(answer.body)) or f"HTTP {answer.status}"
            raise DriverError("slurm_failed", errors[:300])
    except DriverError as exc:
        raise _unreachable(exc) from None
    with transaction.atomic():
        SlurmJob.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())
        record_event(
            instance,
            EventKind.STATE,
            code="job_cancel_requested",
            params={"name": job.name, "slurm_id": job.slurm_id, "user": _who(user)},
        )
        enqueue_on_commit(FOLLOW_TASK, instance.pk)
    try:
        refresh_queue(instance, driver=link.driver)
    except DriverError as exc:
        logger.info("the queue of %s was not read after a cancel: %s", instance.public_id, exc)
    job.refresh_from_db()
    return job


def _at(epoch: int) -> datetime | None:
    return datetime.fromtimestamp(epoch, tz=UTC) if epoch > 0 else None


def refresh_queue(instance: Instance, *, driver: Any = None) -> int:
    """Read the slice's queue from slurmrestd into the cache (and new output of its jobs); how
    many jobs are still live. One request for the queue, one read per job with new output."""
    cluster = slurm.cluster_of(instance)
    if cluster is None or cluster.started_at is None or instance.state != InstanceState.RUNNING:
        return 0
    link = _Link(instance, cluster, driver)
    answer = link.call("GET", link.api.jobs_path())
    if answer.status >= 400:
        raise DriverError("slurm_failed", "; ".join(link.api.errors(answer.body))[:300])
    statuses = {s.job_id: s for s in link.api.parse_jobs(answer.body)}
    rows = {
        j.slurm_id: j for j in SlurmJob.objects.filter(instance=instance, slurm_id__in=statuses)
    }
    for slurm_id, status in statuses.items():
        row = rows.get(slurm_id)
        if row is None:  # submitted in the terminal (sbatch): the console shows it too
            row, _ = SlurmJob.objects.get_or_create(
                instance=instance,
                slurm_id=slurm_id,
                defaults={"name": status.name[:64] or "job", "script": "", "nodes": 0},
            )
        _apply(instance, row, status)
    for row in SlurmJob.objects.filter(instance=instance, output_complete=False).exclude(
        slurm_id=None
    ):
        if row.group != JobGroup.QUEUED:
            _read_output(link, row)
    SlurmCluster.objects.filter(pk=cluster.pk).update(queue_refreshed_at=timezone.now())
    return SlurmJob.objects.filter(instance=instance).exclude(group=JobGroup.DONE).count()


def _apply(instance: Instance, row: SlurmJob, status: slurmconf.JobStatus) -> None:
    group = slurmconf.state_group(status.state)
    fields = {
        "slurm_state": status.state[:24],
        "group": group,
        "reason": status.reason[:64] if group == JobGroup.QUEUED else "",
        "node_list": status.nodes[:1000],
        "started_at": _at(status.start_time) if group != JobGroup.QUEUED else None,
        "ended_at": _at(status.end_time) if group == JobGroup.DONE else None,
        "exit_code": status.exit_code if group == JobGroup.DONE else None,
    }
    if all(getattr(row, k) == v for k, v in fields.items()):
        return
    with transaction.atomic():
        # Compare-and-set on the group: the "ended" event is written once, whoever refreshes.
        won = SlurmJob.objects.filter(pk=row.pk, group=row.group).update(**fields) == 1
        if won and group == JobGroup.DONE and row.group != JobGroup.DONE:
            record_event(
                instance,
                EventKind.STATE,
                code="job_ended",
                level=EventLevel.INFO if status.state == "COMPLETED" else EventLevel.WARNING,
                params={
                    "name": row.name,
                    "slurm_id": row.slurm_id,
                    "state": status.state,
                    "exit_code": status.exit_code,
                },
            )
    for key, value in fields.items():
        setattr(row, key, value)
    events.broadcast_job_on_commit(instance, row, "")  # its new state, to the pages


def _read_output(link: _Link, row: SlurmJob) -> None:
    """New output of one job, appended to its kept tail; complete once the job ended and the
    file was read to its end."""
    try:
        chunk = link.driver.slurm_output(
            link.spec, link.setup, int(row.slurm_id or 0), row.output_offset, OUTPUT_READ
        )
    except DriverError as exc:
        logger.info("output of job %s not read: %s", row.slurm_id, exc)
        return
    done = row.group == JobGroup.DONE and chunk.next_offset >= chunk.size
    if not chunk.text and not done:
        return
    text = (row.output + chunk.text)[-OUTPUT_KEEP:]
    with transaction.atomic():
        SlurmJob.objects.filter(pk=row.pk).update(
            output=text, output_offset=chunk.next_offset, output_complete=done
        )
        # Streamed to the job's page over the instance's websocket (the page polls as fallback).
        events.broadcast_job_on_commit(link.instance, row, chunk.text)
    row.output, row.output_offset, row.output_complete = text, chunk.next_offset, done


def follow_jobs(instance_id: int, *, driver: Any = None) -> str:
    """One pass of the follower: refresh the queue; in job mode release the slice once the
    order's job ended. "again" while jobs are live (or output is unread)."""
    instance = Instance.objects.filter(pk=instance_id).select_related("gpu_model").first()
    if instance is None or instance.state != InstanceState.RUNNING:
        return "done"
    try:
        live = refresh_queue(instance, driver=driver)
    except DriverError as exc:
        logger.warning("the queue of %s was not read: %s", instance.public_id, exc)
        return "again"
    cluster = slurm.cluster_of(instance)
    if cluster is not None and cluster.release_on_job_end:
        job = SlurmJob.objects.filter(instance=instance, from_order=True).first()
        if job is not None and job.group == JobGroup.DONE and job.output_complete:
            release_instance(instance, by="job", code="job_release")
            return "released"
    unread = SlurmJob.objects.filter(instance=instance, output_complete=False).exists()
    return "again" if live or unread else "done"


def follow_live_jobs() -> int:
    """Celery beat: a follower for every running slice with a live job or unread output (one
    whose follower was lost with its worker); how many were queued."""
    ids = (
        SlurmJob.objects.filter(instance__state=InstanceState.RUNNING)
        .filter(Q(output_complete=False) | ~Q(group=JobGroup.DONE))
        .values_list("instance_id", flat=True)
        .distinct()
    )
    found = list(ids)
    for pk in found:
        enqueue(FOLLOW_TASK, pk)
    return len(found)


def submit_order_job(instance_id: int, *, driver: Any = None) -> str:
    """Job mode: the order's job, once the slice runs (once: a job from the order exists)."""
    instance = (
        Instance.objects.filter(pk=instance_id).select_related("created_by", "gpu_model").first()
    )
    if instance is None or instance.state != InstanceState.RUNNING:
        return "nothing to do"
    cluster = slurm.cluster_of(instance)
    if cluster is None or not cluster.job_request:
        return "nothing to do"
    if SlurmJob.objects.filter(instance=instance, from_order=True).exists():
        return "submitted"
    try:
        submit_job(
            instance, instance.created_by, cluster.job_request, driver=driver, from_order=True
        )
    except (OrderRefused, SlurmUnreachable) as exc:
        record_event(
            instance,
            EventKind.ERROR,
            code="job_submit_failed",
            level=EventLevel.ERROR,
            params={"error": exc.message()[:300]},
        )
        if cluster.release_on_job_end:
            release_instance(instance, by="job", code="job_release")
        return "failed"
    return "submitted"
