"""Driving an instance's nodes: provisioning in parallel, running, teardown.

One worker holds an instance's lease (``Instance.lease_until``, compare-and-set) while it drives
it, renewed by a heartbeat thread (``Lease``); the reconciler's take-over pass re-drives an
instance whose lease lapsed (its worker died). Per node, the steps of ``slices.lifecycle`` run in
order in a thread of their own (driver calls are I/O); only the calling thread touches the
database for the drive: it records each finished step, the log lines and the state changes and
notices a release requested meanwhile. Every step is idempotent on the node (the instance's
directory and container are named after it), so a re-driven instance resumes each node after its
last recorded step, and so does a drive retried in place after a transient database or broker
error (console/retries.py): such an error never fails the instance.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import Http404
from django.utils import timezone

from billing import services as billing
from billing.choices import BillingMode
from console.retries import TRANSIENT_ERRORS, close_connections, retry_transient
from console.tenancy import for_row
from marketplace import services as marketplace
from slices import events, lifecycle
from slices.choices import EventKind, EventLevel, InstanceState, NodeHealth
from slices.drivers import DriverError, InstanceSpec, Mount, NodeDriver, NodeTarget, get_driver
from slices.drivers.base import DiskMount
from slices.messages import FAILURE_TEXT
from slices.models import Instance, InstanceNode, Node
from slices.services import access, heartbeats, ports, slurm, storage
from slices.services.instances import (
    INSTANCE_RESOURCE,
    enqueue_on_commit,
    fail_instance,
    finish_teardown,
    price_name,
    record_event,
    record_logs,
    transition,
)

logger = logging.getLogger(__name__)

MAX_STEP_ATTEMPTS = 3
LOG_FLUSH_SECONDS = 0.5


def lease_seconds() -> int:
    return int(settings.SLICES_LEASE_SECONDS)


def heartbeat_seconds() -> float:
    """How often the driving worker renews its lease: five beats per lease, so a lease only
    lapses after five missed renewals in a row (a dead worker, or the database away that long)."""
    return max(0.2, lease_seconds() / 5)


class LeaseLost(Exception):
    """Another worker took the instance over while this one could not renew its lease."""


class Lease:
    """This worker's hold on an instance (``Instance.lease_until``), renewed by a heartbeat thread
    every ``heartbeat_seconds()`` while the worker drives it, so a short lease (15 s) is never
    lost during a long step and a dead worker's instance is taken over a lease-time later.

    Renewing and dropping are compare-and-set on the value this worker last wrote: a worker that
    could not renew for a whole lease (the database away) and was taken over neither extends nor
    drops its successor's lease; ``lost`` tells it to stop. The heartbeat opens its own database
    connection for each beat and closes it after (one more connection only while it renews)."""

    def __init__(self, instance_pk: int, until: datetime) -> None:
        self.pk = instance_pk
        self.until = until
        self.lost = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{instance_pk}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def renew(self) -> bool:
        """Extend by a lease from now if still ours; False (and ``lost``) if another took it."""
        with self._lock:
            if self.lost:
                return False
            until = timezone.now() + timedelta(seconds=lease_seconds())
            if Instance.objects.filter(pk=self.pk, lease_until=self.until).update(
                lease_until=until
            ):
                self.until = until
                return True
            # Not matched: lost if another worker's lease is there now; a lease nobody holds is
            # taken back; a row this connection cannot see (a test's open transaction) is left.
            held = list(Instance.objects.filter(pk=self.pk).values_list("lease_until", flat=True))
            if held and held[0] is not None:
                self.lost = True
            elif held and Instance.objects.filter(pk=self.pk, lease_until__isnull=True).update(
                lease_until=until
            ):
                self.until = until
                return True
            return False

    def _beat(self) -> None:
        while not self._stop.wait(heartbeat_seconds()):
            try:
                self.renew()
            except Exception as exc:  # the database away: keep beating, the lease has slack
                logger.warning("lease %s not renewed: %s", self.pk, type(exc).__name__)
            finally:
                close_connections()  # this thread's; none kept between beats
            if self.lost:
                logger.warning("instance %s was taken over by another worker", self.pk)
                return

    def release(self) -> None:
        """Stop the heartbeat and drop the lease if it is still ours (retried on a blip; if the
        database stays away, the lease simply lapses a lease-time later)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        if self.lost:
            return
        try:
            retry_transient(
                lambda: Instance.objects.filter(pk=self.pk, lease_until=self.until).update(
                    lease_until=None
                ),
                what=f"dropping the lease of instance {self.pk}",
            )
        except TRANSIENT_ERRORS:
            logger.warning("lease of instance %s left to lapse", self.pk)


# The leases this process holds, by (instance, the thread driving it): the lease functions take
# the instance, and each thread finds its own hold (two threads never hold one instance at once,
# but one may still be letting go of a lapsed hold while another took the instance over).
_held: dict[tuple[int, int], Lease] = {}
_held_lock = threading.Lock()


def _key(instance: Instance) -> tuple[int, int]:
    return (instance.pk, threading.get_ident())


def acquire_lease(instance: Instance) -> bool:
    """Take the instance for this worker unless another live worker holds it (compare-and-set),
    and renew it from a heartbeat thread (``Lease``) until ``drop_lease``."""
    now = timezone.now()
    until = now + timedelta(seconds=lease_seconds())
    won = Instance.objects.filter(pk=instance.pk).filter(lease_until__isnull=True).update(
        lease_until=until
    ) or Instance.objects.filter(pk=instance.pk, lease_until__lt=now).update(lease_until=until)
    if won != 1:
        return False
    lease = Lease(instance.pk, until)
    with _held_lock:
        _held[_key(instance)] = lease
    lease.start()
    return True


def lease_lost(instance: Instance) -> bool:
    """Whether this thread's lease on the instance was taken over by another worker."""
    with _held_lock:
        lease = _held.get(_key(instance))
    return lease is not None and lease.lost


def drop_lease(instance: Instance) -> None:
    """Stop renewing and let go (only a lease this worker still holds)."""
    with _held_lock:
        lease = _held.pop(_key(instance), None)
    if lease is not None:
        lease.release()


# ---------------------------------------------------------------------------------------------
# What the driver gets
# ---------------------------------------------------------------------------------------------


def node_target(node: Node, rank: int, gpu_mask: int, ssh_port: int | None = None) -> NodeTarget:
    layout = node.layout or {}
    return NodeTarget(
        hostname=node.hostname,
        address=node.address,
        port=node.ssh_port,
        host_key=node.host_key_fingerprint,
        rank=rank,
        gpus=tuple(i for i in range(node.gpus_per_node) if gpu_mask >> i & 1),
        workdir=str(layout.get("workdir") or settings.SLICES_NODE_WORKDIR),
        runtime=str(layout.get("runtime") or settings.SLICES_NODE_RUNTIME),
        # Whether the instance holds the whole node (its network, its runtime) is the driver's
        # to decide from these two: the node's size, and whether one tenant uses it at a time.
        node_gpus=node.gpus_per_node,
        single_tenant=layout.get("single_tenant") is True,
        instance_ssh_port=int(ssh_port or 0),
    )


def _image_ports(instance: Instance) -> tuple[int, ...]:
    """The service ports of the instance's image (catalogue data), published per instance."""
    if not instance.image:
        return ports.node_ports(instance)
    try:
        version = marketplace.get_image_version(instance.image)
    except Http404:
        return ports.node_ports(instance)
    found = (p.get("port") for p in version.ports if isinstance(p, dict))
    image = {p for p in found if isinstance(p, int) and 0 < p < 65536}
    # ... and the web ports the customer declared (issue 19), opened through the console's proxy.
    return tuple(sorted(image | set(ports.node_ports(instance))))


def build_spec(instance: Instance) -> InstanceSpec:
    parts = list(instance.nodes.select_related("node").order_by("rank"))
    targets = tuple(node_target(p.node, p.rank, p.gpu_mask, p.ssh_port) for p in parts)
    disks = tuple(
        DiskMount(str(a.disk.public_id), a.disk.mount_path, a.mode == "ro", a.disk.size_gb)
        for a in instance.disk_attachments.filter(detached_at__isnull=True).select_related("disk")
    )
    return InstanceSpec(
        instance_id=str(instance.public_id),
        slug=instance.slug,
        name=instance.name,
        owner=instance.team.pfs_key,  # the team's /pfs directory
        image=instance.container,
        entrypoint=instance.entrypoint,
        # The customer's and the platform's (``instance.env``); job_env's values win over both.
        # ... and JupyterLab's token and base URL, the console's (issue 19).
        env={
            **storage.checkpoint_env(instance),
            **dict(instance.env),
            **ports.base_url_env(instance),
        },
        mounts=tuple(Mount(str(m["source"]), str(m["target"])) for m in instance.mounts),
        ssh_public_key=instance.ssh_public_key,
        nodes=targets,
        gpus_per_node=len(targets[0].gpus) if targets else 0,
        partition_key=instance.partition_key,
        # SIM_* and MASTER_PORT are the platform's (envpolicy): only the console sets them.
        sim_fail=str(instance.env.get("SIM_FAIL", "")),
        master_port=_master_port(instance.env),
        disks=disks,
        system_disk_gb=instance.system_disk_gb,
        ports=_image_ports(instance),
        ssh_host_key=instance.ssh_host_key,
        slurm_run=slurm.run_dir(instance),
    )


def _master_port(env: dict[str, Any]) -> int:
    """The rendezvous port: 29500 unless the platform's environment set MASTER_PORT (a test host
    running several jobs at once)."""
    value = str(env.get("MASTER_PORT", ""))
    return int(value) if value.isdigit() and 0 < int(value) < 65536 else 29500


# ---------------------------------------------------------------------------------------------
# Provisioning
# ---------------------------------------------------------------------------------------------


class _Logs:
    """Log lines from the node threads, collected for the database thread (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: list[tuple[str, str, str]] = []

    def sink(self, node: str, step: str) -> Any:
        def log(text: str) -> None:
            with self._lock:
                self._lines.append((node, step, text))

        return log

    def drain(self) -> list[tuple[str, str, str]]:
        with self._lock:
            lines, self._lines = self._lines, []
        return lines


@dataclass
class _NodeRun:
    part: InstanceNode
    target: NodeTarget
    attempts: int = 0


def _still_provisioning(instance: Instance) -> bool:
    return Instance.objects.filter(pk=instance.pk, state=InstanceState.PROVISIONING).exists()


def provision_instance(instance_id: int, driver: NodeDriver | None = None) -> str:
    """Drive a provisioning instance to running (or failed). Safe to call twice: the second call
    finds the lease taken (returns "busy") or the work done.

    A transient infrastructure error (the database cut, Redis away; console/retries.py) is not
    the order's fault: the drive is retried in place, resuming every node after its last
    recorded step, while the heartbeat keeps the lease. If it outlasts the retries, the error
    goes up to the task (re-queued with backoff) and the reconciler takes over at the latest a
    lease-time later; the instance never fails for it. Any other error fails it cleanly."""
    instance = Instance.objects.filter(pk=instance_id).select_related("team", "created_by").first()
    if instance is None or instance.state != InstanceState.PROVISIONING:
        return "nothing to do"
    if not acquire_lease(instance):
        return "busy"
    driver = driver or get_driver(instance.driver or None)
    tries = 0

    def attempt() -> str:
        nonlocal tries
        tries += 1
        return _provision_attempt(instance, driver, first=tries == 1)

    try:
        outcome = retry_transient(attempt, what=f"provisioning {instance.public_id}")
    except LeaseLost:
        return "taken over"  # the other worker drives it now; its lease is not ours to drop
    except TRANSIENT_ERRORS:
        raise  # not failed: the task retries, else the reconciler re-drives it
    except Exception as exc:  # a bug: fail cleanly, free everything
        logger.exception("provisioning %s crashed", instance.public_id)
        fail_instance(instance, "internal", {"error": type(exc).__name__})
        outcome = "failed"
    finally:
        drop_lease(instance)
    if outcome == "cancelled":
        # Released mid-provisioning: the release's teardown found this lease taken and gave up,
        # so it runs now (not when the reconciler notices the instance a lease-time later).
        enqueue_on_commit("slices.tasks.teardown_instance_task", instance.pk)
    return outcome


def _provision_attempt(instance: Instance, driver: NodeDriver, *, first: bool) -> str:
    """One drive from the database's record: a retry after a transient error first looks at
    what the last attempt committed (its answer may have been lost with the connection)."""
    if not first:
        instance.refresh_from_db()
        if instance.state != InstanceState.PROVISIONING:
            done = {InstanceState.RUNNING: "running", InstanceState.FAILED: "failed"}
            return done.get(InstanceState(instance.state), "cancelled")
    storage.ensure_pfs(instance.team)  # the account's /pfs directory exists before any mount
    return _provision(instance, driver, first=first)


def _provision(instance: Instance, driver: NodeDriver, *, first: bool = True) -> str:
    access.assign_ssh_ports(instance)  # the instance's sshd on each node (kept on a retry)
    access.ensure_host_key(instance)  # ... and its host key, the same on every node (issue 29)
    spec = build_spec(instance)
    logs = _Logs()
    if (first and instance.attempts == 0) or instance.provisioning_noted_at is None:
        with transaction.atomic():  # the field is written with its event
            instance.provisioning_noted_at = timezone.now()
            Instance.objects.filter(pk=instance.pk).update(
                provisioning_noted_at=instance.provisioning_noted_at
            )
            record_event(
                instance,
                EventKind.STATE,
                code="provisioning",
                params={"nodes": len(spec.nodes)},
                at=instance.provisioning_noted_at,
            )
    if instance.isolated_at is None:  # once: a retry or a migration's provisioning keeps it
        try:
            driver.isolate(spec, logs.sink("", lifecycle.Step.ISOLATE))
        except DriverError as exc:
            record_logs(instance, logs.drain())
            fail_instance(
                instance,
                exc.code if exc.code in _KNOWN else "driver_error",
                {"error": exc.detail or exc.code, "node": ""},
            )
            return "failed"
        record_logs(instance, logs.drain())
        pkey = f"{spec.partition_key:#06x}" if spec.partition_key is not None else "—"
        with transaction.atomic():  # the field is written with its event
            instance.isolated_at = timezone.now()
            Instance.objects.filter(pk=instance.pk).update(isolated_at=instance.isolated_at)
            record_event(
                instance,
                EventKind.STEP,
                code="isolated",
                step="isolate",
                params={"pkey": pkey},
                at=instance.isolated_at,
            )
    runs = {
        p.rank: _NodeRun(p, t)
        for p, t in zip(
            instance.nodes.select_related("node").order_by("rank"), spec.nodes, strict=True
        )
    }
    failure = _run_nodes(instance, driver, spec, runs, logs)
    record_logs(instance, logs.drain())
    if failure is not None:
        code, params = failure
        fail_instance(instance, code, params)
        return "failed"
    if not _still_provisioning(instance):
        return "cancelled"
    # 启动 Slurm (issue 31): the slice's own, once every node is up; once (``started_at``).
    slurm_failure = slurm.start_slurm(instance, driver, spec, logs.sink("", "slurm"))
    record_logs(instance, logs.drain())
    if slurm_failure is not None:
        fail_instance(instance, *slurm_failure)
        return "failed"
    if spec.nodes and len(spec.nodes) > 1 and (first or not instance.allreduce):
        _allreduce(instance, driver, spec, logs)  # once: a retry keeps the figures it has
    if not mark_running(instance, spec):
        return "cancelled"
    slurm.after_running(instance)  # job mode: the order's job is submitted now
    return "running"


_KNOWN = set(FAILURE_TEXT)  # driver error codes with a message of their own


class _NodeSteps:
    """Runs every node's remaining steps in a thread pool, nodes in parallel, and records each
    result from the calling thread (the only one that touches the database)."""

    def __init__(
        self, instance: Instance, driver: NodeDriver, spec: InstanceSpec,
        runs: dict[int, _NodeRun], logs: _Logs,
    ) -> None:  # fmt: skip
        self.instance, self.spec, self.runs, self.logs = instance, spec, runs, logs
        self.ops = {
            lifecycle.Step.CONNECT: driver.connect,
            lifecycle.Step.PREPARE: driver.prepare,
            lifecycle.Step.MOUNT: driver.mount,
            lifecycle.Step.START: driver.start,
            lifecycle.Step.HEALTH: driver.health,
        }
        self.backoff = float(settings.SLICES_RETRY_BACKOFF_SECONDS)
        self.pending: dict[Future[Any], tuple[int, lifecycle.Step]] = {}
        self.failure: tuple[str, dict[str, Any]] | None = None

    def run(self) -> tuple[str, dict[str, Any]] | None:
        """The first permanent failure (code, params), or None when every node is done. A
        database error here (recording a step) ends the round: the steps under way finish, the
        queued ones never start, and the caller retries from what was recorded."""
        workers = max(1, min(len(self.runs), int(settings.SLICES_PROVISION_THREADS)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="provision") as pool:
            try:
                self._loop(pool)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        return self.failure

    def _loop(self, pool: ThreadPoolExecutor) -> None:
        # Every node's first step on its way before anything is recorded.
        skipped = [(rank, self._submit_next(pool, rank)) for rank in sorted(self.runs)]
        for rank, steps in skipped:
            self._record_skipped(rank, steps)
        while self.pending:
            done, _ = wait(
                list(self.pending), timeout=LOG_FLUSH_SECONDS, return_when=FIRST_COMPLETED
            )
            record_logs(self.instance, self.logs.drain())
            if lease_lost(self.instance):  # the heartbeat renews it; another worker took over
                raise LeaseLost(str(self.instance.public_id))
            for fut in done:
                rank, step = self.pending.pop(fut)
                try:
                    result = fut.result()
                except DriverError as exc:
                    self.failed(pool, rank, step, exc)
                else:
                    _record_published_ports(self.runs[rank], step, result)
                    self.succeeded(pool, rank, step)

    def submit(self, pool: ThreadPoolExecutor, rank: int, delay: float = 0.0) -> None:
        self._record_skipped(rank, self._submit_next(pool, rank, delay))

    def _record_skipped(self, rank: int, steps: list[lifecycle.Step]) -> None:
        for step in steps:
            _record_step(self.instance, self.runs[rank], step)

    def _submit_next(
        self, pool: ThreadPoolExecutor, rank: int, delay: float = 0.0
    ) -> list[lifecycle.Step]:
        """Submit the node's next step with work; the steps before it without any ("isolate",
        the instance's and done; "ready") are returned, to be recorded once it is on its way:
        recorded first, node after node, they made a slice's nodes start one after another."""
        run = self.runs[rank]
        skipped: list[lifecycle.Step] = []
        step = lifecycle.next_step(run.part.step)
        while step is not None and step not in self.ops:
            skipped.append(step)
            step = lifecycle.next_step(step)
        if step is None:
            return skipped
        op, sink, target, spec = (
            self.ops[step],
            self.logs.sink(run.target.hostname, step),
            run.target,
            self.spec,
        )

        def call() -> Any:
            if delay:
                time.sleep(delay)
            return op(spec, target, sink)

        self.pending[pool.submit(call)] = (rank, step)
        return skipped

    def succeeded(self, pool: ThreadPoolExecutor, rank: int, step: lifecycle.Step) -> None:
        run = self.runs[rank]
        run.attempts = 0
        _record_step(self.instance, run, step)
        # A release requested meanwhile stops the loop quietly (its teardown is queued).
        if self.failure is None and _still_provisioning(self.instance):
            self.submit(pool, rank)

    def failed(
        self, pool: ThreadPoolExecutor, rank: int, step: lifecycle.Step, exc: DriverError
    ) -> None:
        run = self.runs[rank]
        run.attempts += 1
        if not exc.permanent and run.attempts < MAX_STEP_ATTEMPTS and self.failure is None:
            delay = self.backoff * 2 ** (run.attempts - 1)
            record_event(
                self.instance, EventKind.STEP, code="step_retry", step=step,
                node=run.target.hostname, level=EventLevel.WARNING,
                params={"step": step, "error": exc.detail or exc.code,
                        "delay": round(delay, 2), "attempt": run.attempts + 1},
            )  # fmt: skip
            self.submit(pool, rank, delay)
            return
        _node_failed(self.instance, run, step, exc)
        if self.failure is None:
            code = exc.code if exc.code in _KNOWN else "driver_error"
            self.failure = (code, {"error": exc.detail or exc.code, "node": run.target.hostname})


def _run_nodes(
    instance: Instance,
    driver: NodeDriver,
    spec: InstanceSpec,
    runs: dict[int, _NodeRun],
    logs: _Logs,
) -> tuple[str, dict[str, Any]] | None:
    """Every node's remaining steps, nodes in parallel; the first permanent failure stops it."""
    return _NodeSteps(instance, driver, spec, runs, logs).run()


def _record_published_ports(run: _NodeRun, step: lifecycle.Step, result: Any) -> None:
    """The host ports docker published for the instance on a shared node (``start``'s
    ``ports``): where the console's tunnel goes for each web port (issue 19)."""
    data = getattr(result, "data", None) or {}
    if step == lifecycle.Step.START and isinstance(data.get("ports"), dict):
        published = {str(k): int(v) for k, v in data["ports"].items()}
        InstanceNode.objects.filter(pk=run.part.pk).update(published_ports=published)


def _record_step(instance: Instance, run: _NodeRun, step: lifecycle.Step) -> None:
    prev = run.part.step
    with transaction.atomic():
        won = (
            InstanceNode.objects.filter(pk=run.part.pk, step=prev).update(
                step=step, step_started_at=timezone.now(), message=""
            )
            == 1
        )
        if won:
            run.part.step = step
            if step != lifecycle.Step.READY:
                record_event(
                    instance,
                    EventKind.STEP,
                    code="step_done",
                    step=step,
                    node=run.target.hostname,
                    params={"step": step},
                )
            events.broadcast_progress_on_commit(instance)


def _node_failed(instance: Instance, run: _NodeRun, step: str, exc: DriverError) -> None:
    InstanceNode.objects.filter(pk=run.part.pk).update(failed=True, message=str(exc)[:255])
    record_event(
        instance,
        EventKind.ERROR,
        code="step_failed",
        step=step,
        node=run.target.hostname,
        level=EventLevel.ERROR,
        params={"step": step, "error": exc.detail or exc.code},
    )


def record_node_warning(instance: Instance, code: str, hostname: str, exc: DriverError) -> None:
    """A step failed on one node without failing the instance (a stop, a teardown)."""
    record_event(
        instance,
        EventKind.ERROR,
        code=code,
        node=hostname,
        level=EventLevel.WARNING,
        params={"node": hostname, "error": exc.detail or exc.code},
    )


def _allreduce(instance: Instance, driver: NodeDriver, spec: InstanceSpec, logs: _Logs) -> None:
    """A slice's all-reduce check; the figures are stored beside the expected ones."""
    expected = (instance.allocation.performance if instance.allocation else {}) or {}
    try:
        result = driver.allreduce_check(spec, logs.sink("", "health")).data
    except DriverError as exc:
        result = {"measured": False, "why": exc.detail or exc.code}
    record_logs(instance, logs.drain())
    if result.get("measured") and result.get("simulated"):
        # The simulated fabric reports what the α–β model expects for this placement.
        result = {
            **result,
            "busbw_gbps": expected.get("busbw_gbps"),
            "latency_us": expected.get("allreduce_small_us"),
        }
    Instance.objects.filter(pk=instance.pk).update(allreduce=result)
    if result.get("measured"):
        record_event(
            instance,
            EventKind.STEP,
            code="allreduce",
            step="health",
            params={
                "busbw": result.get("busbw_gbps"),
                "latency": result.get("latency_us"),
                "expected_busbw": expected.get("busbw_gbps"),
                "expected_latency": expected.get("allreduce_small_us"),
            },
        )
    else:
        record_event(
            instance,
            EventKind.STEP,
            code="allreduce_not_measured",
            step="health",
            level=EventLevel.WARNING,
            params={"why": str(result.get("why", ""))},
        )


def mark_running(instance: Instance, spec: InstanceSpec) -> bool:
    """Provisioning → running, and billing starts, in one transaction (one billing start)."""
    first = spec.nodes[0]
    now = timezone.now()
    # The instance's own sshd on its first node, reached through the region's gateway; without
    # one (a runtime that gives none) the node's address as before.
    port = int(first.instance_ssh_port or settings.SLICES_INSTANCE_SSH_PORT or first.port)
    user = settings.SLICES_INSTANCE_SSH_USER
    gateway = access.region_gateway(instance) if first.instance_ssh_port else None
    if gateway is not None:
        access.assign_gateway_port(instance)  # kept for the instance's life (issue 29)
    ssh = access.shown_access(instance, first.address, port, user, gateway).command
    unpaid = False
    with transaction.atomic():
        if not transition(
            instance,
            InstanceState.RUNNING,
            code="running",
            params={"ssh": ssh},
            running_at=now,
            ssh_host=first.address,
            ssh_port=port,
            ssh_user=user,
        ):
            return False
        # Every node just answered the start's steps: its heartbeat is renewed at every start
        # (a node idle for hours is not "silent" the moment it runs something again).
        started = Node.objects.filter(hostname__in=[t.hostname for t in spec.nodes])
        heartbeats.nodes_answered(list(started.values_list("pk", flat=True)), now, source="start")
        price = price_name(instance.gpu_model.code) or instance.gpu_model.code
        if instance.gpuless:
            # 无卡模式: no GPU charge; the system disk stays billed as storage.
            record_event(instance, EventKind.STATE, code="gpuless_running")
        elif instance.term_paid_until is not None:
            pass  # restarted after a migration: the term was paid once, up front
        elif instance.billing_mode == BillingMode.TERM and instance.term_days:
            try:
                with transaction.atomic():
                    rental = billing.purchase_term(
                        for_row(instance),
                        gpu_model=price,
                        cards=instance.cards,
                        days=instance.term_days,
                        resource_kind=INSTANCE_RESOURCE,
                        resource_id=str(instance.public_id),
                        label=instance.name,
                        region=instance.region.code if instance.region else "",
                    )
            except billing.BillingError:
                unpaid = True
            else:
                until = now + timedelta(days=instance.term_days)
                Instance.objects.filter(pk=instance.pk).update(
                    auto_release_at=until, term_paid_until=until
                )
                record_event(
                    instance,
                    EventKind.STATE,
                    code="term_started",
                    params={"days": instance.term_days, "total": str(rental.total)},
                )
        else:
            session = billing.open_usage_session(
                for_row(instance),
                resource_kind=INSTANCE_RESOURCE,
                resource_id=str(instance.public_id),
                gpu_model=price,
                cards=instance.cards,
                label=instance.name,
                at=now,
                region=instance.region.code if instance.region else "",
            )
            record_event(
                instance,
                EventKind.STATE,
                code="billing_started",
                params={"rate": str(session.rate * session.cards)},
            )
    if unpaid:
        fail_instance(instance, "insufficient_funds", {})
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Teardown
# ---------------------------------------------------------------------------------------------


def teardown_instance(instance_id: int, driver: NodeDriver | None = None) -> str:
    """Clean every node of a releasing or failed instance in parallel, then free its GPUs.

    A node that cannot be cleaned (unreachable) is held back from scheduling for an operator
    rather than given to the next customer with our container on it; its GPUs are still freed
    from this instance and billing already stopped at the decision.

    A transient error (console/retries.py) retries the step that met it, in place: the nodes'
    cleaning (idempotent) or the recording that follows it; past the retries the task re-queues
    and the reconciler re-drives the release (however often it takes: its GPUs must be freed).
    """
    instance = Instance.objects.filter(pk=instance_id).select_related("team", "created_by").first()
    if instance is None or instance.resources_freed_at is not None:
        return "nothing to do"
    if instance.state not in (InstanceState.RELEASING, InstanceState.FAILED):
        return "not releasing"
    if not acquire_lease(instance):
        return "busy"
    driver = driver or get_driver(instance.driver or None)
    what = f"tearing down {instance.public_id}"
    try:
        logs, errors = retry_transient(lambda: _clean_nodes(instance, driver), what=what)
        retry_transient(lambda: _record_teardown(instance, logs, errors), what=what)
        return "done"
    finally:
        drop_lease(instance)


def _clean_nodes(
    instance: Instance, driver: NodeDriver
) -> tuple[list[tuple[str, str, str]], dict[str, DriverError]]:
    """The driver's teardown on every started node, in parallel: (log lines, errors by node)."""
    spec = build_spec(instance)
    logs = _Logs()
    started = [p for p in instance.nodes.select_related("node") if p.step not in ("", "reserve")]
    targets = {t.hostname: t for t in spec.nodes}
    errors: dict[str, DriverError] = {}
    if started:
        with ThreadPoolExecutor(max_workers=max(1, min(len(started), 32))) as pool:
            futs = {
                pool.submit(
                    driver.teardown, spec, targets[p.hostname], logs.sink(p.hostname, "teardown")
                ): p
                for p in started
            }
            for fut, p in futs.items():
                try:
                    fut.result()
                except DriverError as exc:
                    errors[p.hostname] = exc
    return logs.drain(), errors


def _record_teardown(
    instance: Instance, logs: list[tuple[str, str, str]], errors: dict[str, DriverError]
) -> None:
    """What the cleaning found, then the GPUs freed once (``finish_teardown``, compare-and-set:
    a retry after a lost answer finds them freed and only ends the release)."""
    instance.refresh_from_db(fields=["state", "resources_freed_at"])
    if instance.resources_freed_at is None:
        record_logs(instance, logs)
        for hostname, err in errors.items():
            Node.objects.filter(hostname=hostname).update(
                health=NodeHealth.DEGRADED, note=f"teardown of {instance.slug} failed"[:255]
            )
            record_node_warning(instance, "teardown_failed", hostname, err)
    slurm.release_ports(instance)
    finish_teardown(instance)
