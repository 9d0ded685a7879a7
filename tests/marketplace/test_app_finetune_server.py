"""The fine-tuning AI application (marketplace/apps/lora-studio/server.py) trains for real.

The server runs in the recipe environment (``var/recipe-venv``: torch CPU, transformers, peft, as
the image ships them) on a free loopback port, with a tiny LLaMA-architecture model and dataset
made offline by tests/slices/recipe_tiny.py, ``TRAINER`` pointing at the llama-lora recipe's
train.py and ``PFS`` at a temporary directory. The test talks to it over HTTP as the page does:
it lists the datasets, refuses bad runs, runs a few steps to the end (the adapter lands under PFS
where the API says), refuses a second run while one goes, and stops a run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / "var" / "recipe-venv" / "bin" / "python"
SERVER = ROOT / "marketplace" / "apps" / "lora-studio" / "server.py"
TRAINER = ROOT / "marketplace" / "recipes" / "llama-lora" / "train.py"
TINY = ROOT / "tests" / "slices" / "recipe_tiny.py"
KEY = "test-app-key-0123456789"
JUPYTER = "test-jupyter-token-9876543210"

pytestmark = [
    pytest.mark.recipe,
    pytest.mark.skipif(
        not PYTHON.exists(), reason="var/recipe-venv is missing (make recipe-env builds it)"
    ),
]


@dataclass
class Studio:
    client: httpx.Client
    pfs: Path
    mounted: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_env(tmp: Path, pfs: Path, model: Path, mounted: Path) -> dict[str, str]:
    """What the instance gives the app, plus what train.py needs on a CPU test host."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "GPC_APP_API_KEY": KEY,
        "JUPYTER_TOKEN": JUPYTER,
        "PFS": str(pfs),
        "MODEL_DIR": str(model),
        "DATASET_DIR": str(mounted),
        "TRAINER": str(TRAINER),
        "CUDA_VISIBLE_DEVICES": "",  # the CPU: a plain `python train.py`, no torchrun
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(tmp / "hf"),
    }


@contextlib.contextmanager
def _serve(tmp: Path, *args: str) -> Iterator[Studio]:
    """The tiny model and datasets in ``tmp``, the server on a free port until the block ends."""
    model, mounted, pfs = tmp / "model", tmp / "mounted", tmp / "pfs"
    subprocess.run([str(PYTHON), str(TINY), str(model), str(mounted)], check=True, timeout=180)
    # Datasets under /pfs/datasets: a directory, a JSON Lines file, and a directory without data.
    (pfs / "datasets" / "colors").mkdir(parents=True)
    shutil.copy(mounted / "train.json", pfs / "datasets" / "colors" / "train.json")
    rows = json.loads((mounted / "train.json").read_text(encoding="utf-8"))
    (pfs / "datasets" / "extra.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    (pfs / "datasets" / "empty").mkdir()
    (pfs / "datasets" / "empty" / "notes.txt").write_text("not a dataset")

    port = _free_port()
    log = tmp / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(PYTHON), str(SERVER), "--host", "127.0.0.1", "--port", str(port), *args],
            env=_server_env(tmp, pfs, model, mounted),
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=20,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield Studio(client, pfs, mounted, log)
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)  # the server ends a run that still goes, then exits
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Studio]:
    tmp = tmp_path_factory.mktemp("lora-studio")
    (tmp / "more" / "greetings").mkdir(parents=True)  # a --data-root: a directory of datasets
    (tmp / "more" / "greetings" / "train.jsonl").write_text(
        json.dumps({"instruction": "你好", "input": "", "output": "你好 呀"}, ensure_ascii=False)
    )
    disk = tmp / "data" / "disk-0a1b2c3d" / "mine"  # a cloud disk, a dataset in it
    disk.mkdir(parents=True)
    (disk / "rows.json").write_text((tmp / "more" / "greetings" / "train.jsonl").read_text())
    (tmp / "data" / "disk-0a1b2c3d" / "photos").mkdir()
    args = ("--data-root", str(tmp / "more"), "--disks", str(tmp / "data"))
    with _serve(tmp, *args) as running:
        yield running


def _wait_for(
    studio: Studio, name: str, done: Callable[[dict[str, Any]], bool], seconds: float = 45
) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        run = studio.client.get(f"/api/runs/{name}").json()
        if done(run):
            return run
        assert time.monotonic() < deadline, (run, studio.output())
        time.sleep(0.2)


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["message"], body
    return str(body["error"]["message"])


def test_it_needs_the_key_except_for_the_health_check(studio: Studio) -> None:
    anonymous = httpx.Client(base_url=studio.client.base_url, timeout=10)
    health = anonymous.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    for path in ("/", "/api/datasets", "/api/runs", "/api/runs/x"):
        response = anonymous.get(path)
        _error(response, 401)
        assert response.json()["error"]["code"] == "invalid_api_key"
    _error(anonymous.post("/api/runs", json={}), 401)
    _error(anonymous.get("/api/runs", headers={"Authorization": "Bearer wrong"}), 401)
    # JUPYTER_TOKEN goes with the `token` scheme (what the console's proxy adds), not Bearer.
    _error(anonymous.get("/api/runs", headers={"Authorization": f"Bearer {JUPYTER}"}), 401)
    assert anonymous.get("/api/runs", headers={"Authorization": f"token {JUPYTER}"}).is_success
    anonymous.close()


def test_the_page_is_self_contained_and_speaks_chinese_or_english(studio: Studio) -> None:
    zh = studio.client.get("/")
    assert zh.status_code == 200 and zh.headers["content-type"].startswith("text/html")
    page = zh.text
    assert "浏览器里微调" in page and 'lang="zh-CN"' in page
    for anchor in ('id="dataset"', 'id="run-name"', 'id="max-steps"', 'id="start"'):
        assert anchor in page
    for anchor in ('id="progress"', 'id="status"', 'id="stop"', 'id="chart"', 'id="log"'):
        assert anchor in page
    # Relative URLs only (the console's proxy serves the app under a path prefix), nothing
    # fetched from elsewhere.
    for absolute in ("http://", "https://", 'src="/', 'href="/', 'fetch("/', 'api("/'):
        assert absolute not in page, absolute
    en = studio.client.get("/", headers={"Accept-Language": "en-US,en;q=0.9"})
    assert "Fine-tune in the browser" in en.text and "浏览器里微调" not in en.text


def test_the_datasets_are_listed(studio: Studio) -> None:
    datasets = studio.client.get("/api/datasets").json()["datasets"]
    paths = {d["path"]: d for d in datasets}
    assert set(paths) == {
        str(studio.mounted),
        str(studio.pfs / "datasets" / "colors"),
        str(studio.pfs / "datasets" / "extra.jsonl"),
        str(studio.pfs.parent / "more" / "greetings"),
        str(studio.pfs.parent / "data" / "disk-0a1b2c3d" / "mine"),
    }
    assert paths[str(studio.pfs.parent / "data" / "disk-0a1b2c3d" / "mine")]["source"] == "disk"
    assert paths[str(studio.mounted)]["source"] == "mounted"
    assert paths[str(studio.pfs / "datasets" / "colors")]["files"] == 1


def test_bad_runs_are_refused_and_change_nothing(studio: Studio) -> None:
    before = studio.client.get("/api/runs").json()
    colors = str(studio.pfs / "datasets" / "colors")
    good = {"dataset": colors, "name": "bad-run", "max_steps": 6}
    bad = [
        {**good, "max_steps": 0},
        {**good, "max_steps": 5001},
        {**good, "max_steps": "six"},
        {**good, "name": "a/b"},
        {**good, "name": "../x"},
        {**good, "name": "x" * 41},
        {**good, "dataset": "../x"},
        {**good, "dataset": f"{colors}/../colors"},
        {**good, "dataset": "/etc"},
        {**good, "dataset": str(studio.pfs / "datasets" / "empty")},
        {**good, "lora_r": 0},
        {**good, "lora_r": 129},
        {**good, "batch_size": 65},
        {**good, "seq_len": 8},
        {**good, "lr": "fast"},
        {**good, "lora_targets": "everything"},
        {**good, "command": "rm -rf /"},
        {k: v for k, v in good.items() if k != "dataset"},
    ]
    for body in bad:
        _error(studio.client.post("/api/runs", json=body), 400)
    _error(studio.client.post("/api/runs", content=b"{not json"), 400)
    _error(studio.client.post("/api/runs", content=b"[1, 2]"), 400)
    _error(studio.client.post("/api/runs", content=b"x" * (1024 * 1024 + 1)), 413)
    assert studio.client.get("/api/runs").json() == before
    for made in ("lora-studio/bad-run", "checkpoints/bad-run", "adapters/bad-run"):
        assert not (studio.pfs / made).exists()
    _error(studio.client.get("/api/runs/nobody"), 404)
    _error(studio.client.post("/api/runs/nobody/stop"), 404)
    _error(studio.client.get("/api/nothing"), 404)


def test_a_run_goes_to_the_end_and_saves_the_adapter_under_pfs(studio: Studio) -> None:
    body = {
        "dataset": str(studio.pfs / "datasets" / "colors"),
        "name": "tiny-run",
        "max_steps": 6,
        "save_every": 2,
        "lora_r": 4,
        "batch_size": 4,
        "seq_len": 64,
        "lr": 0.02,
        "lora_targets": "q_proj,k_proj,v_proj,o_proj",
    }
    started = studio.client.post("/api/runs", json=body)
    assert started.status_code == 201, started.text
    assert started.json()["state"] in ("starting", "running")

    run = _wait_for(studio, "tiny-run", lambda r: r["state"] not in ("starting", "running"))
    assert run["state"] == "finished", (run, studio.output())
    assert run["step"] == run["max_steps"] == 6 and run["reason"] == "max_steps"
    assert [s for s, _ in run["losses"]] == [1, 2, 3, 4, 5, 6]
    assert all(isinstance(v, float) and v > 0 for _, v in run["losses"])
    assert run["loss"] == run["losses"][-1][1]
    assert run["device"] == "cpu" and run["world_size"] == 1
    assert [c["step"] for c in run["checkpoints"]] == [2, 4, 6]
    assert run["adapter"] == str(studio.pfs / "adapters" / "tiny-run") and run["adapter_ready"]
    adapter = Path(run["adapter"])
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").is_file()
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    assert any('"event": "done"' in line for line in run["log_tail"])
    assert (studio.pfs / "lora-studio" / "tiny-run" / "train.log").is_file()

    listed = studio.client.get("/api/runs").json()
    assert listed["active"] is None
    assert {"name": "tiny-run", "state": "finished"}.items() <= listed["runs"][0].items()
    # A name is used once (train.py would resume from, and overwrite, the old run's files).
    _error(studio.client.post("/api/runs", json=body), 409)


def test_one_run_at_a_time_and_a_run_can_be_stopped(studio: Studio) -> None:
    body = {"dataset": str(studio.mounted), "name": "long-run", "max_steps": 5000}
    body |= {"save_every": 0, "seq_len": 64, "log_every": 1}
    assert studio.client.post("/api/runs", json=body).status_code == 201
    other = {**body, "name": "second-run", "max_steps": 6}
    response = studio.client.post("/api/runs", json=other)
    assert "one run at a time" in _error(response, 409)
    assert response.json()["error"]["code"] == "run_active"
    assert not (studio.pfs / "lora-studio" / "second-run").exists()

    running = _wait_for(studio, "long-run", lambda r: r["step"] >= 1)
    assert running["state"] == "running" and running["max_steps"] == 5000
    assert studio.client.get("/healthz").json()["running"] == "long-run"

    stopped = studio.client.post("/api/runs/long-run/stop")
    assert stopped.status_code == 200, stopped.text
    run = _wait_for(studio, "long-run", lambda r: r["state"] not in ("running", "stopping"), 20)
    assert run["state"] == "stopped", run
    assert run["returncode"] is not None and run["adapter"] is None and not run["adapter_ready"]
    assert 1 <= run["step"] < 5000
    step = run["step"]
    time.sleep(0.5)
    assert studio.client.get("/api/runs/long-run").json()["step"] == step  # nothing trains on
    assert studio.client.get("/api/runs").json()["active"] is None
    _error(studio.client.post("/api/runs/long-run/stop"), 409)


def test_it_refuses_to_start_without_a_key(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PFS": str(tmp_path)}
    done = subprocess.run(
        [str(PYTHON), str(SERVER), "--port", str(_free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "GPC_APP_API_KEY" in done.stderr


def _load_server_module() -> Any:
    """server.py imports only the standard library: the console's Python can load it."""
    spec = importlib.util.spec_from_file_location("lora_studio_server", SERVER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_more_than_one_gpu_trains_with_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process per visible GPU under torchrun (``python -m torch.distributed.run``); a plain
    ``python train.py`` on one GPU or the CPU. (A real two-process run on the CPU, gloo, takes
    half a minute on a small machine: ``--nproc 2`` runs the same command.)"""
    server = _load_server_module()
    monkeypatch.setenv("GPC_APP_API_KEY", KEY)
    monkeypatch.setenv("PFS", str(tmp_path))
    monkeypatch.delenv("NPROC_PER_NODE", raising=False)
    cfg = server.make_config(
        server.parse_args(["--trainer", str(TRAINER), "--model-dir", "/models/m"])
    )
    run = server.Run(
        name="r1",
        dataset="/datasets/d",
        params={**server.defaults(), "max_steps": 7},
        directory=tmp_path,
    )
    for visible, processes in (("0,1,2,3", 4), ("0", 1), ("", 0), ("-1", 0)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert server.visible_gpus() == processes
        cfg.nproc = None
        argv = server.Studio(cfg).argv(run, 0)
        trainer_at = argv.index(str(TRAINER))
        assert argv[trainer_at + 1 :][:2] == ["--model", "/models/m"]
        assert argv[argv.index("--max-steps") + 1] == "7"
        assert argv[argv.index("--resume") + 1] == "none"
        if processes > 1:
            assert argv[:4] == [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            assert argv[argv.index("--nproc_per_node") + 1] == str(processes)
        else:
            assert argv[:2] == [sys.executable, str(TRAINER)]


def test_a_run_the_server_lost_is_listed_as_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs are listed again after a restart; one that was going has no process any more."""
    server = _load_server_module()
    monkeypatch.setenv("GPC_APP_API_KEY", KEY)
    monkeypatch.setenv("PFS", str(tmp_path))
    cfg = server.make_config(server.parse_args(["--trainer", str(TRAINER)]))
    for name, state in (("old-run", "finished"), ("lost-run", "running")):
        (cfg.state_dir / name).mkdir(parents=True)
        record = {"name": name, "dataset": "/d", "params": {}, "state": state, "step": 3}
        (cfg.state_dir / name / "run.json").write_text(json.dumps(record))
    studio = server.Studio(cfg)
    assert studio.active is None
    assert studio.get("old-run")["state"] == "finished"
    lost = studio.get("lost-run")
    assert lost["state"] == "interrupted" and lost["step"] == 3 and lost["error"]
    saved = json.loads((cfg.state_dir / "lost-run" / "run.json").read_text())
    assert saved["state"] == "interrupted"
