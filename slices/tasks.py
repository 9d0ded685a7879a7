"""Celery tasks of the instance lifecycle: ids in, one service call, safe to run twice.

Provisioning and teardown hold the instance's lease while they work, so a redelivered message
finds it busy or done; a worker killed mid-task leaves the lease to expire and the reconciler
re-drives the instance from its last recorded step.

Time limits: every task has Celery's soft and hard limits (``CELERY_TASK_SOFT_TIME_LIMIT`` /
``CELERY_TASK_TIME_LIMIT``, 29.5 / 30 minutes: the longest legitimate task, a provisioning over
SSH, fits), and the recipe follower much shorter ones of its own. A prefork worker (production)
enforces them. The embedded worker's thread pool cannot interrupt a thread, so it enforces
neither: there every loop bounds itself instead (the follower: ``RECIPE_FOLLOW_SECONDS`` and
``FOLLOW_MAX_LINES`` per run; provisioning: the driver's step and SSH command timeouts and the
attempt limit; the simulated recipe: O(1) per read whatever its parameters).

Transient infrastructure errors (the database cut, Redis away: console/retries.py) are retried
in place by the services and, past that, by the task itself (``TransientRetryTask``: re-queued
with backoff); no task turns one into a failed instance. A worker that dies is taken over by
``take_over_instances_task`` (beat, every ``SLICES_TAKEOVER_INTERVAL`` seconds) once the lease its
heartbeat no longer renews has lapsed (``SLICES_LEASE_SECONDS``).
"""

from __future__ import annotations

import time

from celery import shared_task
from django.conf import settings

from console.retries import TransientRetryTask, retry_transient
from slices.services import (
    access,
    apps,
    provisioning,
    queue,
    recipes,
    reconcile,
    reservations,
    slurm_jobs,
    telemetry,
)
from slices.services.migration import drive_migration
from slices.services.power import drive_start, drive_stop


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def provision_instance_task(instance_id: int) -> str:
    result = provisioning.provision_instance(instance_id)
    if result == "running":
        # A recipe run: follow its output (the beat starts a lost follower again).
        retry_transient(lambda: recipes.on_running(instance_id), what="following a recipe")
        retry_transient(lambda: apps.on_running(instance_id), what="watching an app's health")
    return result


# A follower run lasts RECIPE_FOLLOW_SECONDS plus one bounded pass (reads are bounded by the
# driver's SSH command timeout): its own limits, far below the default half hour.
FOLLOW_SOFT_TIME_LIMIT = int(settings.RECIPE_FOLLOW_SECONDS) + 2 * 60
FOLLOW_TIME_LIMIT = FOLLOW_SOFT_TIME_LIMIT + 30


@shared_task(
    base=TransientRetryTask,
    acks_late=True,
    ignore_result=True,
    soft_time_limit=FOLLOW_SOFT_TIME_LIMIT,
    time_limit=FOLLOW_TIME_LIMIT,
)
def follow_recipe_task(instance_id: int) -> str:
    """Read a running recipe's output (one bounded run); queued again, ``RECIPE_FOLLOW_INTERVAL``
    later, until the run ends: between runs the worker's thread serves other customers."""
    what = f"following the recipe of instance {instance_id}"
    result = retry_transient(lambda: recipes.follow_recipe(instance_id), what=what)
    interval = float(settings.RECIPE_FOLLOW_INTERVAL)
    if follow_recipe_task.request.is_eager:
        # Tests run tasks inline: go on here rather than nest one call per pass.
        while result == "again":
            time.sleep(interval)
            result = recipes.follow_recipe(instance_id)
        return result
    if result == "again":
        retry_transient(
            lambda: follow_recipe_task.apply_async((instance_id,), countdown=interval), what=what
        )
    return result


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def follow_recipes_task() -> int:
    """Celery beat: recipe runs whose follower was lost are followed again."""
    return retry_transient(recipes.follow_running_recipes, what="restarting recipe followers")


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True, soft_time_limit=60)
def follow_app_task(instance_id: int) -> str:
    """Ask a running AI application's health check once (issue 20); queued again,
    ``APP_HEALTH_INTERVAL`` later, until it answers or has been given its patience."""
    what = f"checking the app of instance {instance_id}"
    result = retry_transient(lambda: apps.follow_app(instance_id), what=what)
    interval = float(settings.APP_HEALTH_INTERVAL)
    if follow_app_task.request.is_eager:
        while result == "again":  # tests run tasks inline: go on here
            time.sleep(interval)
            result = apps.follow_app(instance_id)
        return result
    if result == "again":
        retry_transient(
            lambda: follow_app_task.apply_async((instance_id,), countdown=interval), what=what
        )
    return result


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def follow_apps_task() -> int:
    """Celery beat: running apps not yet answering whose watcher was lost are watched again."""
    return retry_transient(apps.follow_running_apps, what="restarting app watchers")


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def teardown_instance_task(instance_id: int) -> str:
    return provisioning.teardown_instance(instance_id)


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def stop_instance_task(instance_id: int) -> str:
    """关机: stop the node's container, keep the system disk, free the GPUs."""
    return drive_stop(instance_id)


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def start_instance_task(instance_id: int) -> str:
    """开机: move the system disk if the host changed, then provision as usual."""
    result = drive_start(instance_id)
    if result == "running":  # an app starts again: watch its health check again
        retry_transient(lambda: apps.on_running(instance_id), what="watching an app's health")
    return result


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def migrate_instance_task(instance_id: int) -> str:
    """A node of a running instance failed: allocate a replacement and restart from the checkpoint."""
    return drive_migration(instance_id)


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def reconcile_instances_task() -> str:
    """Celery beat: re-drive stuck instances, auto-release, free leaked GPUs (idempotent; each
    of its passes retries transient errors itself)."""
    return str(reconcile.reconcile())


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def run_reservations_task() -> str:
    """Celery beat (every minute): booked windows' notices (T−24 h, T−1 h), failed pins covered,
    due windows started as instances at their start minus the provisioning lead (issue 32)."""
    return str(reservations.run_reservations())


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def take_over_instances_task() -> str:
    """Celery beat (every few seconds): instances whose worker died (lease lapsed) are driven
    on by another worker; the reconciler's cheap first pass alone, so it can run often."""
    return str(reconcile.take_over())


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def check_idle_instances_task() -> str:
    """Celery beat (every minute): warn owners of idle instances; release where they chose it."""
    decisions = retry_transient(telemetry.check_idle_instances, what="checking idle instances")
    return f"{sum(d.verdict.idle for d in decisions)} idle of {len(decisions)}"


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def prune_telemetry_task() -> str:
    """Celery beat (hourly): delete GPU rollups older than TELEMETRY_RETENTION_DAYS."""
    pruned = retry_transient(telemetry.prune_rollups, what="pruning telemetry")
    return f"{pruned} rollups pruned"


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def sync_gateway_task(region_id: int) -> str:
    """Write the region gateway's keys file from the database (queued on commit after an SSH
    endpoint appeared or went: running, release, stop, migration)."""
    return retry_transient(lambda: access.sync_region(region_id), what="syncing a gateway's keys")


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def sync_gateways_task() -> str:
    """Celery beat (SLICES_GATEWAY_SYNC_INTERVAL): every gateway's keys file written again, so a
    write that failed (the gateway away) or a file changed by hand converges."""
    results = retry_transient(access.sync_all_gateways, what="syncing gateway keys")
    return "; ".join(results) or "no gateways"


# -- the slice's Slurm (issue 31) -----------------------------------------------------------------
@shared_task(
    base=TransientRetryTask, acks_late=True, ignore_result=True, soft_time_limit=60, time_limit=90
)
def follow_slurm_jobs_task(instance_id: int) -> str:
    """Refresh a slice's cached queue and its jobs' output (one pass); queued again,
    ``SLURM_FOLLOW_INTERVAL`` later, while a job is live. Run inline (tests), one pass only: the
    tests drive the follower themselves."""
    what = f"following the Slurm jobs of instance {instance_id}"
    result = retry_transient(lambda: slurm_jobs.follow_jobs(instance_id), what=what)
    if result == "again" and not follow_slurm_jobs_task.request.is_eager:
        interval = float(settings.SLURM_FOLLOW_INTERVAL)
        retry_transient(
            lambda: follow_slurm_jobs_task.apply_async((instance_id,), countdown=interval),
            what=what,
        )
    return result


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def follow_slurm_jobs_all_task() -> int:
    """Celery beat: slices with live jobs whose follower was lost are followed again."""
    return retry_transient(slurm_jobs.follow_live_jobs, what="restarting Slurm job followers")


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def submit_order_job_task(instance_id: int) -> str:
    """Job mode: submit the order's job once the slice runs (once)."""
    return retry_transient(
        lambda: slurm_jobs.submit_order_job(instance_id), what=f"the job of instance {instance_id}"
    )


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def admit_queue_task(gpu_model: str) -> dict[str, int]:
    """排队: capacity of ``gpu_model`` may have grown: start what the queue lets start, re-estimate
    the rest (one admission per model at a time; safe to run twice)."""
    return queue.admit(gpu_model)


@shared_task(base=TransientRetryTask, acks_late=True, ignore_result=True)
def admit_queues_task() -> int:
    """The beat's safety net: every model with queued orders (maximum waits, lost messages)."""
    return queue.admit_all()
