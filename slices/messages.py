"""What instance events and placement refusals say, per code, in the reader's language.

Services store a code and its parameters (``InstanceEvent.code/params``, ``Instance.failure_code``);
these templates render them where they are shown, so a Chinese reader sees Chinese and an
English reader English, whatever language the worker ran in.
"""

from __future__ import annotations

from typing import Any

from django.utils.functional import Promise
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from slices.choices import gpu_product_name

EVENT_TEXT: dict[str, Promise] = {
    "ordered": _("Ordered %(cards)s × %(gpu_model)s by %(user)s."),
    "allocating": _("Reserving GPUs."),
    "allocated": _("Reserved %(cards)s GPU(s) on %(nodes)s node(s) in %(cluster)s."),
    "provisioning": _("Provisioning %(nodes)s node(s) in parallel."),
    "isolated": _("Fabric partition %(pkey)s isolates this instance's nodes."),
    "step_done": _("%(step)s done."),
    "step_retry": _("%(step)s failed (%(error)s); retrying in %(delay)s s (attempt %(attempt)s)."),
    "step_failed": _("%(step)s failed: %(error)s"),
    "allreduce": _(
        "All-reduce check: %(busbw)s GB/s bus bandwidth, %(latency)s µs (expected %(expected_busbw)s GB/s, %(expected_latency)s µs)."
    ),
    "allreduce_not_measured": _("All-reduce check not measured: %(why)s"),
    "running": _("Running. Connect with: %(ssh)s"),
    "billing_started": _("Billing started at %(rate)s 元 per hour."),
    "term_started": _("Paid %(days)s-day term up front: %(total)s 元."),
    "release_requested": _("Release requested by %(by)s."),
    "auto_release": _("Released automatically at the time chosen when ordering."),
    "billing_stopped": _("Stopped by billing: %(reason)s"),
    "billing_closed": _("Billing stopped: %(seconds)s s charged, %(amount)s 元."),
    "teardown_failed": _(
        "Could not clean %(node)s (%(error)s); the node is held back for an operator."
    ),
    "released": _("Released; all GPUs are free again."),
    # 排队 (issue 32)
    "queued": _(
        "Queued: no cards are free for it now; it waits up to %(max_wait_hours)s h, holding no "
        "GPUs and charged nothing until it starts."
    ),
    "queue_cancelled": _("Queued order cancelled by %(by)s; nothing was charged."),
    "queue_expired": _("Left the queue unstarted: its maximum wait passed. Nothing was charged."),
    "queue_funds": _(
        "Left the queue unstarted: at its start the balance could not carry it. Nothing was "
        "charged."
    ),
    "queue_limits": _(
        "Left the queue unstarted: at its start the card quota or the member's limits did not "
        "allow it. Nothing was charged."
    ),
    "failed": _("Failed: %(reason)s"),
    "resources_freed": _("GPUs freed after the failure; nothing more is charged."),
    "redriven": _(
        "A worker stopped while driving this instance; another one resumes it (attempt %(attempt)s)."
    ),
    "gave_up": _("Provisioning was interrupted %(attempts)s times; giving up."),
    "leaked_allocation": _("Found GPUs held by no live instance; freed them."),
    "idle_warning": _(
        "Idle: all %(gpus)s GPU(s) stayed below %(threshold)s %% utilisation for %(minutes)s minutes (busiest %(peak_gpu)s peaked at %(peak)s %%); %(mem_gib)s GiB of GPU memory still held."
    ),
    "idle_release": _("Released automatically: its GPUs were idle, as chosen when ordering."),
    "app_ready": _("The app answers its health check, %(seconds)s s after the instance started."),
    "app_not_answering": _(
        "The app has not answered its health check (%(path)s) for %(minutes)s minutes: see the logs."
    ),
    "app_exited": _("The app's process ended before it answered: its output is in the logs."),
    "recipe_done": _("The recipe finished at step %(step)s; the adapter is saved at %(adapter)s."),
    "recipe_finished": _("Released automatically: the recipe finished."),
    "recipe_exited": _("The recipe stopped before finishing; released automatically."),
    # Storage and resilience
    "disk_attached": _("Cloud disk %(disk)s attached at %(path)s (%(mode)s)."),
    "disk_detached": _("Cloud disk %(disk)s detached."),
    "disk_resized": _("Cloud disk %(disk)s grown to %(size)s GB."),
    "stopping": _(
        "Stop requested by %(by)s: the GPU charge stops now; the %(disk_gb)s GB system disk is kept and billed as storage (%(per_day)s 元 a day)."
    ),
    "stopped": _("Stopped. The GPUs are free; the %(disk_gb)s GB system disk is kept."),
    "stop_failed": _("Could not stop the container on %(node)s cleanly: %(error)s"),
    "starting": _("Start requested by %(by)s."),
    "start_placed": _("Starting on %(node)s with %(cards)s GPU(s)."),
    "disk_moved": _("The %(gb)s GB system disk was copied from %(from)s to %(to)s."),
    "gpuless_running": _(
        "Running without GPUs (no-GPU mode): no GPU charge, the disk is billed as storage."
    ),
    "stopped_release_warning": _(
        "Stopped for long: this instance and its system disk will be released in about %(hours)s hours unless you start it."
    ),
    "stopped_too_long": _("Released: it stayed stopped longer than the allowed time."),
    "migrating": _(
        "Node %(node)s failed (%(signal)s): migrating this instance to a replacement node; the downtime is not billed."
    ),
    "billing_paused": _(
        "Billing paused for the migration: %(seconds)s s charged so far, %(amount)s 元."
    ),
    "checkpoint_found": _("The job will resume from checkpoint step %(step)s (%(path)s)."),
    "no_checkpoint": _("No checkpoint was found in %(dir)s: the job restarts from the beginning."),
    "replacement_allocated": _("Replacement node(s) allocated: %(summary)s."),
    "no_replacement": _(
        "No replacement node is free right now. The instance waits for one (you may release it instead)."
    ),
    "released_no_replacement": _("Released: no replacement node was free, as you chose."),
    # The web terminal (issue 19): who, which node, how long; never what was typed.
    "terminal_opened": _("%(user)s opened a web terminal on node #%(rank)s."),
    "terminal_operator_opened": _(
        "Operator %(user)s opened a web terminal on node #%(rank)s of this instance (recorded)."
    ),
    "terminal_failed": _("A web terminal on node #%(rank)s could not be opened: %(error)s."),
    "terminal_closed": _(
        "The web terminal of %(user)s on node #%(rank)s closed after %(seconds)s s."
    ),
    "terminal_idle": _(
        "The web terminal of %(user)s on node #%(rank)s closed after %(seconds)s s: no input for %(idle)s s."
    ),
    "terminal_exited": _(
        "The web terminal of %(user)s on node #%(rank)s ended after %(seconds)s s: its shell exited."
    ),
    "terminal_stopped": _(
        "The web terminal of %(user)s on node #%(rank)s closed after %(seconds)s s: the instance is no longer running."
    ),
    # The slice's own Slurm and its jobs (issue 31).
    "slurm_started": _(
        "Slurm runs: slurmctld and slurmrestd on rank 0, slurmd on %(nodes)s node(s) (REST %(api)s)."
    ),
    "job_submitted": _("Job %(name)s submitted to Slurm as job %(slurm_id)s by %(user)s."),
    "job_ended": _(
        "Job %(name)s (Slurm job %(slurm_id)s) ended: %(state)s, exit code %(exit_code)s."
    ),
    "job_cancel_requested": _(
        "Cancel of job %(name)s (Slurm job %(slurm_id)s) requested by %(user)s."
    ),
    "job_release": _("Released automatically: its job ended (job mode)."),
    "job_submit_failed": _("The order's job could not be submitted: %(error)s"),
}

FAILURE_TEXT: dict[str, Promise] = {
    "queue_expired": _("its maximum wait in the queue passed"),
    "queue_funds": _("the balance could not carry it when its turn came"),
    "queue_limits": _("the card quota or the member's limits did not allow it when its turn came"),
    "driver_error": _("a node step failed: %(error)s"),
    "sim_failure": _("simulated failure: %(error)s"),
    "host_key_mismatch": _("the node's SSH host key does not match the pinned key (%(node)s)"),
    "unreachable": _("a node could not be reached (%(node)s): %(error)s"),
    "interrupted": _("provisioning was interrupted too many times"),
    "insufficient_funds": _("the balance could not pay for the term"),
    "no_price": _("no price is set for this GPU model"),
    "stuck": _("no worker made progress for too long"),
    "internal": _("an internal error (%(error)s); everything was freed"),
    "disk_move_failed": _("the system disk could not be copied to the new host: %(error)s"),
    "slurm_failed": _("Slurm did not start in the slice: %(error)s"),
    "slurm_unsupported": _("Slurm cannot run on this node's runtime yet: %(error)s"),
}

# Why billing stopped an instance (billing's close reasons; issue 30 adds the member's budget).
BILLING_STOP_TEXT: dict[str, Promise] = {
    "insufficient_funds": _("the balance ran out"),
    "budget_exhausted": _("its maker's monthly budget in the team is spent"),
}

STEP_TEXT: dict[str, Promise] = {
    "reserve": _("Reserve GPUs"),
    "isolate": _("Isolate on the fabric"),
    "connect": _("Connect"),
    "prepare": _("Prepare directory and user"),
    "mount": _("Mount storage and assets"),
    "start": _("Start the image"),
    "health": _("Health check"),
    "ready": _("Ready"),
    "slurm": _("Starting Slurm"),
}

# Slurm's pending reasons (squeue's REASON), in words; others are shown as Slurm names them.
PENDING_REASON_TEXT: dict[str, Promise] = {
    "None": _("waiting to be scheduled"),
    "Resources": _("waiting for nodes or GPUs to become free"),
    "Priority": _("queued behind jobs of higher priority"),
    "Dependency": _("waiting for the jobs it depends on"),
    "BeginTime": _("waiting for its start time"),
    "JobHeldUser": _("held by its user"),
    "JobHeldAdmin": _("held by an administrator"),
    "PartitionNodeLimit": _("asks for more nodes than the slice has"),
    "PartitionTimeLimit": _("asks for more time than the partition allows"),
    "ReqNodeNotAvail": _("a node it needs is not available"),
    "NodeDown": _("a node it needs is down"),
    "BadConstraints": _("asks for what no node of the slice has"),
    "Reservation": _("waiting for its reservation"),
    "Prolog": _("its prolog is running"),
}


def render(table: dict[str, Promise], code: str, params: dict[str, Any]) -> str:
    template = table.get(code)
    if template is None:
        return code
    params = dict(params)
    if "step" in params:
        params["step"] = str(STEP_TEXT.get(str(params["step"]), params["step"]))
    if "gpu_model" in params:  # stored as the fleet code, shown as people write it
        params["gpu_model"] = gpu_product_name(str(params["gpu_model"]))
    if "reason" in params and isinstance(params["reason"], dict):
        r = params["reason"]
        params["reason"] = render(FAILURE_TEXT, r.get("code", ""), r.get("params", {}))
    elif code == "billing_stopped" and params.get("reason") in BILLING_STOP_TEXT:
        params["reason"] = str(BILLING_STOP_TEXT[params["reason"]])
    try:
        return gettext(str(template)) % params
    except (KeyError, TypeError, ValueError):
        return str(template)


def event_text(code: str, params: dict[str, Any]) -> str:
    return render(EVENT_TEXT, code, params)


def failure_text(code: str, params: dict[str, Any]) -> str:
    return render(FAILURE_TEXT, code, params)


def step_label(step: str) -> str:
    return str(STEP_TEXT.get(step, step))


def pending_reason(reason: str) -> str:
    """Slurm's pending reason in the reader's language (Slurm's name when unknown)."""
    text = PENDING_REASON_TEXT.get(reason)
    return gettext(str(text)) if text is not None else reason
