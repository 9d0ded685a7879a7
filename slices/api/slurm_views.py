"""``/api/v1/instances/<id>/jobs/``: jobs on a slice's own Slurm (issue 31).

Thin: fetch the caller's instance (404 for anyone else's), call ``slices.services.slurm_jobs``,
answer. Lists read the cached queue (``SlurmJob`` rows); only submit and cancel reach slurmrestd.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.tenancy import acting
from slices import services
from slices.messages import pending_reason
from slices.models import Instance, SlurmJob
from slices.services import slurm_jobs


class JobSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="public_id")
    slurm_id = serializers.IntegerField(allow_null=True)
    name = serializers.CharField()
    state = serializers.CharField(source="group", help_text="queued, running or done")
    slurm_state = serializers.CharField(help_text="Slurm's own: PENDING, RUNNING, COMPLETED…")
    reason = serializers.CharField(help_text="Slurm's pending reason code (queued jobs)")
    reason_text = serializers.SerializerMethodField(help_text="The pending reason in words")
    nodes = serializers.IntegerField()
    gpus_per_node = serializers.IntegerField()
    time_limit = serializers.IntegerField(source="time_limit_min", help_text="minutes")
    node_list = serializers.CharField()
    submitted_at = serializers.DateTimeField(source="created_at")
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    exit_code = serializers.IntegerField(allow_null=True)
    from_order = serializers.BooleanField(help_text="The order's own job (job mode)")

    def get_reason_text(self, job: SlurmJob) -> str:
        return pending_reason(job.reason) if job.reason else ""


class JobDetailSerializer(JobSerializer):
    script = serializers.CharField()
    environment = serializers.DictField(child=serializers.CharField())
    output = serializers.CharField(help_text="The output's tail (the whole file is on /pfs)")
    output_complete = serializers.BooleanField()


class JobCreateSerializer(serializers.Serializer):
    script = serializers.CharField(max_length=65536, trim_whitespace=False)
    name = serializers.CharField(max_length=64, required=False, default="job")
    nodes = serializers.IntegerField(min_value=1, max_value=198, required=False, default=1)
    gpus_per_node = serializers.IntegerField(min_value=0, max_value=8, required=False, default=0)
    time_limit = serializers.IntegerField(
        min_value=1, max_value=43200, required=False, default=60, help_text="minutes"
    )
    environment = serializers.DictField(
        child=serializers.CharField(max_length=4096, allow_blank=True), required=False, default=dict
    )


def _instance(request: Request, public_id: str) -> Instance:
    return services.get_instance_for_user(acting(request), public_id)


class JobListView(APIView):
    @extend_schema(
        summary="The slice's Slurm jobs (the cached queue, newest first)",
        responses={200: JobSerializer(many=True)},
        tags=["jobs"],
    )
    def get(self, request: Request, public_id: str) -> Response:
        jobs = slurm_jobs.list_jobs(_instance(request, public_id))
        return Response({"count": len(jobs), "results": JobSerializer(jobs, many=True).data})

    @extend_schema(
        summary="Submit a job to the slice's Slurm (sbatch over slurmrestd)",
        request=JobCreateSerializer,
        responses={201: JobDetailSerializer},
        tags=["jobs"],
    )
    def post(self, request: Request, public_id: str) -> Response:
        instance = _instance(request, public_id)
        payload = JobCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data: dict[str, Any] = dict(payload.validated_data)
        job = slurm_jobs.submit_job(instance, request.user, data)
        return Response(JobDetailSerializer(job).data, status=status.HTTP_201_CREATED)


class JobDetailView(APIView):
    @extend_schema(
        summary="One job, with its output", responses={200: JobDetailSerializer}, tags=["jobs"]
    )
    def get(self, request: Request, public_id: str, job_id: str) -> Response:
        instance = _instance(request, public_id)
        job = slurm_jobs.get_job(instance, job_id)
        data = JobDetailSerializer(job).data
        if not acting(request).may_operate(instance):
            # A job's environment often carries secrets: its names only for a member who may
            # see the slice but not run on it (issue 30).
            data["environment"] = dict.fromkeys(data["environment"], "••••")
        return Response(data)


class JobCancelView(APIView):
    @extend_schema(
        summary="Cancel a queued or running job (scancel)",
        request=None,
        responses={202: JobDetailSerializer},
        tags=["jobs"],
    )
    def post(self, request: Request, public_id: str, job_id: str) -> Response:
        job = slurm_jobs.get_job(_instance(request, public_id), job_id)
        job = slurm_jobs.cancel_job(job, request.user)
        return Response(JobDetailSerializer(job).data, status=status.HTTP_202_ACCEPTED)
