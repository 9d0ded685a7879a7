"""A simulated Slurm for the simulated fleet (issue 31), labelled as such in every answer.

It answers the same REST requests as slurmrestd's ``openapi/v0.0.38`` with the same job
semantics, so ``make demo`` shows jobs through the very code path real slices use: a job waits
its scheduling interval, then runs if the slice has the nodes free (first come, first served:
"Resources" or "Priority" otherwise), for as long as its script's ``sleep`` lines say (scaled by
``SIM_TIME_SCALE``; one second when it has none), or until its time limit (TIMEOUT) or a cancel.
Its output is what the script would print where that can be known without running anything:
``srun ... hostname`` (or ``echo``) once per node, ``echo`` lines with the job's environment
(never a shell: ``$(...)`` is printed as written), ``exit N``; any other line is reported as
"simulated". Nothing runs.

The queue is a JSON file per slice under ``<STATE_DIR>/sim-slurm/<slug>/`` (locked while read and
written), so the web process and the workers see one queue. No Django.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slices.drivers.base import DriverError, InstanceSpec, LogFn, StepResult
from slices.drivers.slurm import OutputChunk, RestAnswer, SlurmSetup
from slices.slurmconf import DEFAULT_API, SlurmPaths

LABEL = "[simulated Slurm]"
SCHED_INTERVAL_S = 1.0
DEFAULT_RUN_S = 1.0
MAX_RUN_S = 24 * 3600.0
_VERSION = {"major": 22, "micro": 8, "minor": 5}
_META = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38 (simulated)"}}


class SimSlurm:
    """One slice's simulated Slurm (its files under ``root``)."""

    def __init__(self, root: Path, nodes: list[str], time_scale: float) -> None:
        self.root = root
        self.nodes = nodes
        self.scale = max(0.0, float(time_scale))

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def output_path(self, job_id: int) -> Path:
        return self.jobs_dir / f"slurm-{int(job_id)}.out"

    @contextlib.contextmanager
    def _queue(self) -> Iterator[dict[str, Any]]:
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        path = self.root / "queue.json"
        with open(self.root / "queue.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                queue = json.loads(path.read_text()) if path.exists() else {"next": 1, "jobs": []}
                yield queue
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(queue))
                os.replace(tmp, path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- REST ---------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: dict[str, Any] | None) -> RestAnswer:
        now = time.time()
        if method == "GET" and path == "/openapi/v3":
            paths: dict[str, Any] = {
                f"/slurm/{DEFAULT_API}/{p}": {} for p in ("jobs", "job/submit", "ping")
            }
            return RestAnswer(200, {"paths": paths, "info": {"title": LABEL}})
        prefix = f"/slurm/{DEFAULT_API}"
        if not path.startswith(prefix):
            return RestAnswer(404, self._answer(errors=["Unable to find requested URL"]))
        route = path[len(prefix) :]
        if method == "GET" and route == "/ping":
            return RestAnswer(200, self._answer(pings=[{"hostname": self.nodes[0], "ping": "UP"}]))
        if method == "POST" and route == "/job/submit":
            return self._submit(body or {}, now)
        with self._queue() as queue:
            self._advance(queue, now)
            if method == "GET" and route == "/jobs":
                return RestAnswer(200, self._answer(jobs=[_job_json(j) for j in queue["jobs"]]))
            match = re.fullmatch(r"/job/(\d+)", route)
            if match:
                job = next((j for j in queue["jobs"] if j["id"] == int(match.group(1))), None)
                if job is None:
                    return RestAnswer(404, self._answer(errors=["Invalid job id specified"]))
                if method == "GET":
                    return RestAnswer(200, self._answer(jobs=[_job_json(job)]))
                if method == "DELETE":
                    self._cancel(job, now)
                    return RestAnswer(200, self._answer())
        return RestAnswer(404, self._answer(errors=["Unable to find requested URL"]))

    def _answer(self, **fields: Any) -> dict[str, Any]:
        return {"meta": {**_META, "Slurm": {"version": _VERSION}}, "errors": [], **fields}

    def _submit(self, body: dict[str, Any], now: float) -> RestAnswer:
        spec = body.get("job") or {}
        script = str(body.get("script") or "")
        nodes = int(spec.get("nodes") or 1)
        if not script.startswith("#!") or nodes < 1:
            return RestAnswer(
                500, self._answer(errors=[{"error_code": 2041, "error": "Invalid job"}])
            )
        if nodes > len(self.nodes):
            errors = [
                {"error_code": 2014, "error": "Requested node configuration is not available"}
            ]
            return RestAnswer(500, self._answer(errors=errors))
        with self._queue() as queue:
            job_id = int(queue["next"])
            queue["next"] = job_id + 1
            queue["jobs"].append(
                {
                    "id": job_id,
                    "name": str(spec.get("name") or "job"),
                    "script": script,
                    "nodes": nodes,
                    "time_limit": int(spec.get("time_limit") or 60),
                    "env": {str(k): str(v) for k, v in (spec.get("environment") or {}).items()},
                    "submit": now,
                    "start": 0.0,
                    "end": 0.0,
                    "state": "PENDING",
                    "reason": "None",
                    "node_list": [],
                    "exit": 0,
                }
            )
            self._advance(queue, now)
        return RestAnswer(200, self._answer(job_id=job_id, step_id="batch"))

    def _cancel(self, job: dict[str, Any], now: float) -> None:
        if job["state"] in ("PENDING", "RUNNING"):
            was_running = job["state"] == "RUNNING"
            job.update(state="CANCELLED", end=now, reason="None", exit=0)
            if not job["start"]:
                job["start"] = now
            if was_running:
                self._write(job, [f"slurmstepd: *** JOB {job['id']} CANCELLED ***"])

    def requeue_lost(self, now: float) -> list[tuple[int, str]]:
        """Running jobs on a node that left the slice go back to the queue: (job, node)."""
        lost = []
        with self._queue() as queue:
            for job in queue["jobs"]:
                gone = [n for n in job["node_list"] if n not in self.nodes]
                if job["state"] == "RUNNING" and gone:
                    self._write(
                        job, [f"{LABEL} *** JOB {job['id']} REQUEUED: NODE_FAIL {gone[0]} ***"]
                    )
                    job.update(
                        state="PENDING", reason="BeginTime", start=0.0, node_list=[], submit=now
                    )
                    lost.append((int(job["id"]), gone[0]))
        return lost

    # -- scheduling ----------------------------------------------------------------------------
    def _duration(self, script: str) -> float:
        total = sum(
            float(m) for m in re.findall(r"(?m)^\s*sleep\s+([0-9]+(?:\.[0-9]+)?)\s*$", script)
        )
        return min(MAX_RUN_S, total or DEFAULT_RUN_S) * self.scale

    def _advance(self, queue: dict[str, Any], now: float) -> None:
        """Bring every job to where it is at ``now`` (finishing runs first, then starting
        queued jobs in order while their nodes are free)."""
        for job in queue["jobs"]:
            if job["state"] == "RUNNING":
                limit = job["start"] + job["time_limit"] * 60 * max(self.scale, 1e-9)
                end = job["start"] + self._duration(job["script"])
                if min(end, limit) <= now:
                    self._finish(job, min(end, limit), timed_out=limit < end)
        busy = {n for j in queue["jobs"] if j["state"] == "RUNNING" for n in j["node_list"]}
        blocked = False
        for job in queue["jobs"]:
            if job["state"] != "PENDING":
                continue
            free = [n for n in self.nodes if n not in busy]
            if blocked:
                job["reason"] = "Priority"
                continue
            if now < job["submit"] + SCHED_INTERVAL_S * self.scale:
                job["reason"] = "None"
                blocked = True
                continue
            if len(free) < job["nodes"]:
                job["reason"] = "Resources"
                blocked = True
                continue
            job.update(state="RUNNING", start=now, reason="None", node_list=free[: job["nodes"]])
            busy.update(job["node_list"])
            self._write(job, [f"{LABEL} job {job['id']} runs on {', '.join(job['node_list'])}"])
            end = now + self._duration(job["script"])
            if end <= now:
                self._finish(job, now, timed_out=False)
                busy.difference_update(job["node_list"])

    def _finish(self, job: dict[str, Any], at: float, *, timed_out: bool) -> None:
        lines, code = _play(job["script"], job["node_list"], job["env"])
        if timed_out:
            lines.append(f"slurmstepd: *** JOB {job['id']} CANCELLED DUE TO TIME LIMIT ***")
            job.update(state="TIMEOUT", end=at, exit=0)
        else:
            job.update(state="COMPLETED" if code == 0 else "FAILED", end=at, exit=code)
        self._write(job, lines)

    def _write(self, job: dict[str, Any], lines: list[str]) -> None:
        with open(self.output_path(job["id"]), "a", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in lines)


def _job_json(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_id": job["id"],
        "name": job["name"],
        "job_state": job["state"],
        "state_reason": job["reason"],
        "nodes": ",".join(job["node_list"]),
        "node_count": job["nodes"],
        "submit_time": int(job["submit"]),
        "start_time": int(job["start"]),
        "end_time": int(job["end"]),
        "exit_code": job["exit"],
        "comment": LABEL,
    }


_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def _expand(text: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1), ""), text)


def _play(script: str, nodes: list[str], env: dict[str, str]) -> tuple[list[str], int]:
    """What the script prints, where that can be known without running it (see the module)."""
    out: list[str] = []
    base = {**env, "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes))}
    for raw in script.splitlines()[1:]:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        if words[0] == "sleep":
            continue
        if words[0] == "exit":
            return out, int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        if words[0] == "srun":
            count, rest = len(nodes), words[1:]
            while rest and rest[0].startswith("-"):
                flag = rest.pop(0)
                if flag in ("-N", "--nodes") and rest:
                    count = int(rest.pop(0)) if rest[0].isdigit() else count
                elif flag.startswith("--nodes="):
                    value = flag.split("=", 1)[1]
                    count = int(value) if value.isdigit() else count
                elif flag in ("-n", "--ntasks", "-c", "--gpus-per-node", "-G") and rest:
                    rest.pop(0)
            for node in nodes[: max(1, min(count, len(nodes)))]:
                node_env = {**base, "SLURMD_NODENAME": node, "HOSTNAME": node}
                if rest[:1] == ["hostname"]:
                    out.append(node)
                elif rest[:1] == ["echo"]:
                    out.append(_expand(" ".join(rest[1:]), node_env))
                else:
                    out.append(f"{LABEL} {node}: {' '.join(rest)}")
            continue
        if words[0] == "echo":
            out.append(_expand(" ".join(words[1:]), base))
        elif words[0] == "hostname":
            out.append(nodes[0] if nodes else "")
        else:
            out.append(f"{LABEL} ran: {line}")
    return out, 0


# -- what SimDriver exposes (slices.drivers.slurm.SlurmDriver) -------------------------------------


def sim_root(state_dir: str, spec: InstanceSpec) -> Path:
    return Path(state_dir) / "sim-slurm" / spec.slug


def for_spec(state_dir: str, spec: InstanceSpec, time_scale: float) -> SimSlurm:
    return SimSlurm(sim_root(state_dir, spec), [n.hostname for n in spec.nodes], time_scale)


def start(state_dir: str, spec: InstanceSpec, setup: SlurmSetup, log: LogFn) -> StepResult:
    # Nothing is written until the first job: its queue file is made by the first request. A
    # start after a node was replaced requeues the jobs that ran on a node no longer in the slice
    # (what Slurm does with a requeueable job on NODE_FAIL); they run again from the queue.
    slurm = for_spec(state_dir, spec, 0)
    if (slurm.root / "queue.json").exists():
        for job_id, gone in slurm.requeue_lost(time.time()):
            log(f"{LABEL} job {job_id} requeued: {gone} left the slice")
    log(
        f"{LABEL} slurmctld and slurmrestd on {spec.nodes[0].hostname}, slurmd on "
        f"{len(spec.nodes)} node(s) with gpu:{setup.gres_type}:{len(spec.nodes[0].gpus)}"
    )
    return StepResult({"api_version": DEFAULT_API, "nodes": len(spec.nodes), "simulated": True})


def output(slurm: SimSlurm, job_id: int, offset: int, limit: int) -> OutputChunk:
    path = slurm.output_path(job_id)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(limit)
    except FileNotFoundError:
        return OutputChunk("", offset, 0)
    if offset + len(data) < size and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return OutputChunk(data.decode("utf-8", errors="replace"), offset + len(data), size)


def paths(state_dir: str, spec: InstanceSpec, setup: SlurmSetup) -> SlurmPaths:
    root = sim_root(state_dir, spec)
    return SlurmPaths(run=str(root), state=str(root), jobs=str(root / "jobs"))


def check(spec: InstanceSpec) -> None:
    if not spec.nodes:
        raise DriverError("slurm_failed", "no nodes", permanent=True)
