"""The Jobs tab of a slice (issue 31): its Slurm jobs, a form to submit one, a job's output.

Thin views over ``slices.services.slurm_jobs``; they read the cached queue (``SlurmJob`` rows)
that the follower refreshes, never slurmrestd per view. Live state: the list and a job's output
are htmx fragments polled every 2 s while a job is live and stopped (286) once everything
settled; without JavaScript the pages work as plain pages and forms.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_http_methods

from console.errors import DomainError
from console.htmx import render_page, stop_polling
from console.tenancy import acting
from slices import services
from slices.choices import InstanceState
from slices.drivers import driver_capabilities
from slices.messages import pending_reason
from slices.models import Instance, SlurmJob
from slices.services import slurm, slurm_jobs

EXAMPLE_SCRIPT = "#!/bin/bash\nsrun -N 2 hostname\n"


class JobForm(forms.Form):
    name = forms.RegexField(
        label=gettext_lazy("Name"), regex=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", initial="job"
    )
    script = forms.CharField(
        label=gettext_lazy("Batch script"),
        widget=forms.Textarea(attrs={"rows": 6, "class": "font-monospace", "spellcheck": "false"}),
        initial=EXAMPLE_SCRIPT,
        max_length=65536,
        strip=False,
    )
    nodes = forms.IntegerField(label=gettext_lazy("Nodes"), min_value=1, max_value=198, initial=1)
    gpus_per_node = forms.IntegerField(
        label=gettext_lazy("GPUs per node"), min_value=0, max_value=8, initial=0
    )
    time_limit = forms.IntegerField(
        label=gettext_lazy("Time limit (minutes)"), min_value=1, max_value=43200, initial=60
    )
    environment = forms.CharField(
        label=gettext_lazy("Environment (NAME=value per line)"),
        widget=forms.Textarea(attrs={"rows": 2, "class": "font-monospace"}),
        required=False,
        strip=False,
    )

    def clean_environment(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for line in self.cleaned_data["environment"].splitlines():
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(_("Each line is NAME=value."))
            env[name.strip()] = value
        return env


def _rows(jobs: list[SlurmJob]) -> list[dict[str, Any]]:
    return [{"job": j, "reason": pending_reason(j.reason) if j.reason else ""} for j in jobs]


def _context(instance: Instance, form: JobForm | None = None) -> dict[str, Any]:
    cluster = slurm.cluster_of(instance)
    jobs = slurm_jobs.list_jobs(instance)
    return {
        "instance": instance,
        "cluster": cluster,
        "ready": cluster is not None
        and cluster.started_at is not None
        and instance.state == InstanceState.RUNNING,
        "rows": _rows(jobs),
        "live": any(j.live for j in jobs),
        "simulated": driver_capabilities(instance.driver or None).simulated,
        "form": form or JobForm(initial={"nodes": min(2, instance.nodes.count() or 1)}),
    }


@login_required
@require_http_methods(["GET", "POST"])
def instance_jobs(request: HttpRequest, public_id: str) -> HttpResponse:
    instance = services.get_instance_for_user(acting(request), public_id)
    form = None
    if request.method == "POST":
        form = JobForm(request.POST)
        if form.is_valid():
            try:
                job = slurm_jobs.submit_job(instance, request.user, form.cleaned_data)
            except DomainError as exc:
                form.add_error(None, exc.message())
            else:
                messages.success(
                    request, _("Submitted job %(name)s (Slurm job %(id)s).")
                    % {"name": job.name, "id": job.slurm_id},
                )  # fmt: skip
                return redirect(
                    "slices:instance-job", public_id=instance.public_id, job_id=job.public_id
                )
    context = _context(instance, form)
    response = render_page(request, "slices/instance_jobs.html", context, "list")
    if request.method == "GET" and request.GET.get("poll") and not context["live"]:
        return stop_polling(response)
    return response


@login_required
@require_http_methods(["GET"])
def instance_job(request: HttpRequest, public_id: str, job_id: str) -> HttpResponse:
    instance = services.get_instance_for_user(acting(request), public_id)
    job = slurm_jobs.get_job(instance, job_id)
    context = {
        "instance": instance,
        "job": job,
        "reason": pending_reason(job.reason) if job.reason else "",
        "polling": job.live or not job.output_complete,
    }
    response = render_page(request, "slices/instance_job.html", context, "job")
    if request.GET.get("poll") and not context["polling"]:
        return stop_polling(response)
    return response


@login_required
@require_http_methods(["POST"])
def instance_job_cancel(request: HttpRequest, public_id: str, job_id: str) -> HttpResponse:
    instance = services.get_instance_for_user(acting(request), public_id)
    job = slurm_jobs.get_job(instance, job_id)
    try:
        slurm_jobs.cancel_job(job, request.user)
    except DomainError as exc:
        messages.error(request, exc.message())
    else:
        messages.info(request, _("Cancel requested for job %(name)s.") % {"name": job.name})
    return redirect("slices:instance-job", public_id=instance.public_id, job_id=job.public_id)
