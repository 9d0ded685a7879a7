"""The Jobs tab and ``/api/v1/instances/<id>/jobs/`` (issue 31), on the simulated fleet's Slurm:
submit, list with the pending reason in words, one job with its output, cancel; both languages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from slices.choices import JobGroup
from slices.models import SlurmJob
from tests.slices.factories import run_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def slice_(sim_fleet, settings, tmp_path, funded, django_capture_on_commit_callbacks):  # noqa: ANN001, ANN201
    settings.STATE_DIR = tmp_path
    return run_order(funded, django_capture_on_commit_callbacks, gpu_model="A800", cards=64)


def test_the_jobs_tab_submits_a_job_and_shows_its_output(
    slice_, alice_client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    detail = alice_client.get(reverse("slices:instance-detail", args=[slice_.public_id]))
    assert 'id="jobs-tab"' in detail.content.decode()
    jobs_url = reverse("slices:instance-jobs", args=[slice_.public_id])
    page = alice_client.get(jobs_url)
    assert "提交作业" in page.content.decode() and "模拟 Slurm" in page.content.decode()
    form = {"name": "hello", "script": "#!/bin/bash\nsrun -N 2 hostname\n", "nodes": 2,
            "gpus_per_node": 8, "time_limit": 5, "environment": "GREETING=hi"}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        answer = alice_client.post(jobs_url, form)
    job = SlurmJob.objects.get(instance=slice_)
    assert answer.status_code == 302
    assert answer["Location"] == reverse(
        "slices:instance-job", args=[slice_.public_id, job.public_id]
    )
    job.refresh_from_db()
    assert job.group == JobGroup.DONE and job.environment == {"GREETING": "hi"}
    shown = alice_client.get(answer["Location"]).content.decode()
    assert "已完成" in shown and job.node_list.split(",")[0] in shown
    # The polled fragment stops once the job ended and its output was read (286).
    polled = alice_client.get(answer["Location"] + "?poll=1", HTTP_HX_REQUEST="true")
    assert polled.status_code == 286
    english = alice_client.get(answer["Location"], HTTP_ACCEPT_LANGUAGE="en")
    assert "Output" in english.content.decode() or "输出" in english.content.decode()


def test_a_refused_job_says_why_on_the_form(slice_, alice_client) -> None:  # noqa: ANN001
    jobs_url = reverse("slices:instance-jobs", args=[slice_.public_id])
    answer = alice_client.post(
        jobs_url, {"name": "big", "script": "#!/bin/sh\n", "nodes": 9, "gpus_per_node": 0,
                   "time_limit": 5, "environment": "PATH=/tmp"},
    )  # fmt: skip
    assert answer.status_code == 200
    assert not SlurmJob.objects.exists()


def test_the_jobs_api_submits_lists_reads_and_cancels(
    slice_, alice_api, bob_client, settings, django_assert_num_queries
) -> None:  # noqa: ANN001
    base = f"/api/v1/instances/{slice_.public_id}/jobs/"
    made = alice_api.post(
        base, {"script": "#!/bin/sh\necho hi $NAME\n", "name": "a", "nodes": 1,
               "environment": {"NAME": "x"}}, format="json",
    )  # fmt: skip
    assert made.status_code == 201, made.content
    assert made.json()["slurm_id"] == 1
    settings.SIM_TIME_SCALE = 1  # the next one waits its scheduling interval
    queued = alice_api.post(
        base, {"script": "#!/bin/sh\nsleep 60\n", "nodes": 8}, format="json"
    ).json()
    listed = alice_api.get(base).json()
    assert listed["count"] == 2 and listed["results"][0]["id"] == queued["id"]
    assert listed["results"][0]["state"] == "queued" and listed["results"][0]["reason_text"]
    one = alice_api.get(f"{base}{made.json()['id']}/").json()
    assert one["state"] == "done" and one["exit_code"] == 0
    cancelled = alice_api.post(f"{base}{queued['id']}/cancel/")
    assert cancelled.status_code == 202 and cancelled.json()["slurm_state"] == "CANCELLED"
    # Another customer's instance does not exist for them.
    assert bob_client.get(base).status_code in (403, 404)
    # Refused: a job larger than the slice, or naming a variable the console sets.
    too_big = alice_api.post(base, {"script": "#!/bin/sh\n", "nodes": 9}, format="json")
    assert too_big.status_code == 400 and too_big.json()["error"] == "invalid"
    with django_assert_num_queries(2):  # the instance, its jobs (the client is authenticated)
        alice_api.get(base)


def test_the_order_form_runs_a_job_and_the_slice_releases_itself(
    sim_fleet, settings, tmp_path, funded, alice_client, django_capture_on_commit_callbacks
) -> None:  # noqa: ANN001
    from slices.choices import InstanceState
    from slices.models import Instance

    settings.STATE_DIR = tmp_path
    page = alice_client.get("/instances/new/?gpu_model=A800&cards=64").content.decode()
    assert "运行作业" in page and 'name="job_script"' in page
    with django_capture_on_commit_callbacks(execute=True):
        answer = alice_client.post(
            "/instances/new/",
            {"gpu_model": "A800", "cards": 64, "billing_mode": "on_demand",
             "job_script": "#!/bin/bash\nsrun -N 8 hostname\n", "job_nodes": "8"},
        )  # fmt: skip
    instance = Instance.objects.get()
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    job = SlurmJob.objects.get(instance=instance, from_order=True)
    assert job.slurm_state == "COMPLETED" and len(job.output.splitlines()) == 9
    instance.refresh_from_db()
    assert instance.state in (InstanceState.RELEASING, InstanceState.RELEASED)


@pytest.mark.django_db(transaction=True)
def test_new_output_is_pushed_over_the_instance_websocket(
    sim_fleet, settings, tmp_path, alice
) -> None:  # noqa: ANN001
    import json
    from decimal import Decimal

    from asgiref.sync import sync_to_async

    from billing import services as billing
    from console.routing import websocket_router
    from slices import services
    from slices.services import slurm_jobs
    from tests.support.servers import run_async
    from tests.support.websocket import open_websocket, websocket_scope

    settings.STATE_DIR = tmp_path
    billing.grant_voucher(alice, Decimal("5000"), reason="test", valid_days=30)
    instance, _ = services.order_instance(
        alice, services.OrderRequest(gpu_model="A800", cards=64)
    )  # provisioned inline on commit (no test transaction here)
    instance.refresh_from_db()

    async def scenario() -> list[dict]:
        path = f"/ws/instances/{instance.public_id}/"
        communicator, first = await open_websocket(
            websocket_router(), websocket_scope(path, user=alice)
        )
        assert first["type"] == "websocket.accept", first
        await communicator.receive_output(timeout=5)  # hello
        await sync_to_async(slurm_jobs.submit_job)(
            instance, alice, {"script": "#!/bin/sh\necho pushed\n", "name": "p"}
        )
        got = []
        while True:
            message = json.loads((await communicator.receive_output(timeout=5))["text"])
            if message["kind"] == "job":
                got.append(message["payload"])
                if "pushed" in message["payload"]["text"]:
                    break
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return got

    pushed = run_async(scenario())
    assert pushed[-1]["text"].endswith("pushed\n") and pushed[-1]["state"] == "done"
