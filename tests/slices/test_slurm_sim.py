"""A slice's Slurm on the simulated fleet (issue 31): the order's scheduler, the step "启动 Slurm",
jobs through the console's one code path (the simulated slurmrestd answers as 22.05's does), the
cached queue, cancel, and job mode releasing the slice when its job ends."""

from __future__ import annotations

import pytest

from slices import services, slurmconf
from slices.choices import InstanceState, JobGroup
from slices.drivers.sim_slurm import SimSlurm, _play
from slices.errors import OrderRefused
from slices.models import InstanceEvent, SlurmCluster, SlurmJob
from slices.services import slurm_jobs
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def slurm_sim(sim_fleet, settings, tmp_path) -> None:  # noqa: ANN001
    settings.STATE_DIR = tmp_path


def _slice(user, capture, **kw):  # noqa: ANN001, ANN202
    return run_order(user, capture, **{"gpu_model": "A800", "cards": 64, **kw})


def test_a_slice_gets_its_own_slurm_by_default_and_a_host_none(
    slurm_sim, funded, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    instance = _slice(funded, django_capture_on_commit_callbacks)
    assert instance.state == InstanceState.RUNNING
    cluster = SlurmCluster.objects.get(instance=instance)
    assert cluster.started_at is not None and cluster.api_version == "v0.0.38"
    assert len(bytes(cluster.munge_key)) == 1024 and len(bytes(cluster.jwt_key)) == 64
    step = InstanceEvent.objects.get(instance=instance, code="slurm_started")
    assert step.step == "slurm" and step.params["nodes"] == 8

    host = run_order(funded, django_capture_on_commit_callbacks, gpu_model="RTX4090", cards=8)
    assert host.state == InstanceState.RUNNING
    assert not SlurmCluster.objects.filter(instance=host).exists()

    with django_capture_on_commit_callbacks(execute=True):
        services.release_instance(instance, by="alice")
    assert not SlurmCluster.objects.get(pk=cluster.pk).active  # its ports are free again
    plain = _slice(funded, django_capture_on_commit_callbacks, scheduler="none")
    assert plain.state == InstanceState.RUNNING
    assert not SlurmCluster.objects.filter(instance=plain).exists()


def test_bad_scheduler_and_job_are_refused_naming_the_field(slurm_sim, funded) -> None:  # noqa: ANN001
    for kw, field in (
        ({"scheduler": "pbs"}, "scheduler"),
        ({"scheduler": "none", "job": {"script": "hostname"}}, "job"),
        ({"job": {"script": "hostname", "nodes": 9}}, "nodes"),
        ({"job": {"script": "x", "environment": {"PATH": "/tmp"}}}, "environment"),
        ({"job": {"script": "x", "name": "a b"}}, "name"),
    ):
        req = services.OrderRequest(gpu_model="A800", cards=64, **kw)
        with pytest.raises(OrderRefused) as info:
            services.order_instance(funded, req)
        assert info.value.field == field, kw


def test_jobs_run_queue_and_cancel_through_the_simulated_slurmrestd(
    slurm_sim, funded, django_capture_on_commit_callbacks, settings
) -> None:  # noqa: ANN001
    instance = _slice(funded, django_capture_on_commit_callbacks)
    script = '#!/bin/bash\nsrun -N 2 hostname\necho "$GREETING"\n'
    with django_capture_on_commit_callbacks(execute=True):
        job = slurm_jobs.submit_job(
            instance,
            funded,
            {"script": script, "name": "hello", "nodes": 2, "gpus_per_node": 8,
             "environment": {"GREETING": "hi $(id)"}},
        )  # fmt: skip
    assert job.slurm_id == 1
    slurm_jobs.follow_jobs(instance.pk)
    job.refresh_from_db()
    assert job.group == JobGroup.DONE and job.slurm_state == "COMPLETED" and job.exit_code == 0
    assert job.output_complete
    lines = job.output.splitlines()
    assert lines[0].startswith("[simulated Slurm] job 1 runs on ")
    assert lines[1:] == [*job.node_list.split(",")[:2], "hi $(id)"]  # data, never a shell's
    assert InstanceEvent.objects.filter(instance=instance, code="job_ended").count() == 1

    # Realistic time: a long job runs, the next one waits for its nodes, cancel ends both.
    settings.SIM_TIME_SCALE = 1
    long_job = slurm_jobs.submit_job(
        instance, funded, {"script": "#!/bin/sh\nsleep 600\n", "name": "long", "nodes": 8}
    )
    waiting = slurm_jobs.submit_job(
        instance, funded, {"script": "#!/bin/sh\nhostname\n", "name": "next", "nodes": 1}
    )
    slurm_jobs.refresh_queue(instance)
    waiting.refresh_from_db()
    assert waiting.group == JobGroup.QUEUED and waiting.reason in ("None", "Priority")
    slurm_jobs.cancel_job(long_job, funded)
    long_job.refresh_from_db()
    assert long_job.group == JobGroup.DONE and long_job.slurm_state == "CANCELLED"
    assert slurm_jobs.list_jobs(instance)[0] == waiting

    # Slurm refuses a job larger than the slice, in its own words.
    with pytest.raises(OrderRefused):
        slurm_jobs.submit_job(instance, funded, {"script": "#!/bin/sh\n", "nodes": 9})


def test_job_mode_releases_the_slice_when_its_job_ends(
    slurm_sim, funded, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    instance = _slice(
        funded,
        django_capture_on_commit_callbacks,
        job={"script": "srun hostname\nexit 3\n", "name": "task", "nodes": 8},
    )
    cluster = SlurmCluster.objects.get(instance=instance)
    assert cluster.release_on_job_end
    job = SlurmJob.objects.get(instance=instance, from_order=True)
    # The order's job was submitted once the slice ran, and the follower (run inline here) saw
    # it end and released the slice; another pass finds nothing to do.
    with django_capture_on_commit_callbacks(execute=True):
        assert slurm_jobs.follow_jobs(instance.pk) == "done"
    job.refresh_from_db()
    assert job.slurm_state == "FAILED" and job.exit_code == 3
    instance.refresh_from_db()
    assert instance.state in (InstanceState.RELEASING, InstanceState.RELEASED)
    assert InstanceEvent.objects.filter(instance=instance, code="job_release").exists()
    assert not SlurmCluster.objects.get(instance=instance).active  # its ports are free again


def test_the_simulated_script_prints_only_what_it_can_know(tmp_path) -> None:  # noqa: ANN001
    lines, code = _play(
        "#!/bin/sh\n# comment\nsrun --nodes=2 echo on $SLURMD_NODENAME\npython train.py\nexit 0\n",
        ["n1", "n2", "n3"],
        {},
    )
    assert lines == ["on n1", "on n2", "[simulated Slurm] ran: python train.py"] and code == 0
    sim = SimSlurm(tmp_path, ["n1"], 0)
    answer = sim.request("GET", "/openapi/v3", None)
    assert slurmconf.detect_api(answer.body["paths"]) == "v0.0.38"


def test_a_failed_node_is_replaced_and_its_running_job_requeued(
    sim_driver, settings, tmp_path, django_capture_on_commit_callbacks, alice
) -> None:  # noqa: ANN001
    """The same-SU replacement of issue 24, in a Slurm slice: the step 启动 Slurm runs again with
    the replacement, and the job that ran on the failed node goes back to the queue and runs."""
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from billing import services as billing
    from slices.services import migration
    from tests.slices.factories import SMALL_FLEET, load_small_fleet

    settings.STATE_DIR = tmp_path
    settings.SLICES_PFS_CONSOLE_ROOT = str(tmp_path / "pfs")
    settings.SLICES_NODE_FAIL_GRACE_SECONDS = 60
    load_small_fleet(SMALL_FLEET.replace("scalable_units: [8]", "scalable_units: [10, 10]"))
    billing.grant_voucher(alice, Decimal("50000"), reason="test", valid_days=30)
    instance = _slice(alice, django_capture_on_commit_callbacks)
    # Steps in hundredths of their time; the job's hour of sleep lasts 36 s: still running when
    # the node fails and after its replacement.
    settings.SIM_TIME_SCALE = 0.01
    job = slurm_jobs.submit_job(
        instance, alice, {"script": "#!/bin/sh\nsleep 3600\n", "name": "train", "nodes": 8}
    )
    import time

    time.sleep(0.05)  # its scheduling interval
    slurm_jobs.refresh_queue(instance)
    job.refresh_from_db()
    assert job.group == JobGroup.RUNNING
    victim = instance.nodes.get(rank=3).node
    t0 = timezone.now()
    migration.report_node_signal(victim, "xid", "Xid 79", at=t0)
    with django_capture_on_commit_callbacks(execute=True):
        assert migration.check_node_health(t0 + timedelta(seconds=61)) == [victim.hostname]
    instance.refresh_from_db()
    assert instance.state == InstanceState.RUNNING
    assert InstanceEvent.objects.filter(instance=instance, code="slurm_started").count() == 2
    assert InstanceEvent.objects.filter(
        instance=instance, kind="log", text__contains=f"requeued: {victim.hostname} left the slice"
    ).exists()
    time.sleep(0.05)
    slurm_jobs.refresh_queue(instance)
    job.refresh_from_db()
    assert job.group == JobGroup.RUNNING and victim.hostname not in job.node_list
    assert "REQUEUED: NODE_FAIL" in job.output


def test_a_viewer_sees_a_jobs_environment_names_only(
    slurm_sim, alice, bob, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    """Issue 30: a job's environment often carries secrets; a member who may see the slice but
    not run on it gets its names, not its values."""
    from decimal import Decimal

    from rest_framework.test import APIClient

    from billing import services as billing
    from console import services as console_services
    from console.teams import services as teams
    from console.tenancy import acting_in

    lab = teams.create_team(alice, "Lab")
    billing.grant_voucher(lab, Decimal("5000"), reason="test", valid_days=30)
    row, raw = teams.invite(acting_in(alice, lab), bob.email, "viewer")
    teams.accept(bob, raw)
    instance = _slice(acting_in(alice, lab), django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        job = slurm_jobs.submit_job(
            instance, alice, {"script": "#!/bin/sh\nhostname\n", "environment": {"TOKEN": "s3cret"}}
        )

    def read(user):  # noqa: ANN001, ANN202
        _t, secret = console_services.create_api_token(user, name="t", team=lab)
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return api.get(f"/api/v1/instances/{instance.public_id}/jobs/{job.public_id}/").json()

    assert read(alice)["environment"] == {"TOKEN": "s3cret"}
    assert read(bob)["environment"] == {"TOKEN": "••••"}
