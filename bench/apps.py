"""AI applications benchmark (issue 20): how long the chat app (llm-chat) takes from the order to
answering, and what the console's API proxy costs a streamed chat completion against calling the
app's server directly, in one run on loopback.

    .venv/bin/python bench/apps.py            # the full run
    .venv/bin/python bench/apps.py --quick    # a reduced run (what the test runs)

Set-up (not measured): a throw-away SQLite database with the shipped fleet and the shipped
catalogue; one sshd test host (tests/support/sshd.py: Debian's OpenSSH on a loopback port, its
host key pinned); the first RTX 4090 node pointed at it (runtime=process, the other RTX 4090 nodes
in maintenance), as tests/e2e/test_app_chat.py does: the recipe environment's Python
(var/recipe-venv: torch and Transformers, what the app's image ships) first on the node's PATH,
``APP_EXTRA_ENV`` pointing ``APP_DIR`` at the checkout's marketplace/apps/llm-chat (the image bakes
it at /opt/apps/llm-chat), and a tiny chat model made offline (tests/marketplace/app_tiny.py: a
2-layer LLaMA with random weights and a word-level tokenizer) where the catalogue mounts the app's
default model from (``<asset root>/models/Qwen/Qwen2.5-7B-Instruct``). The app's server runs on
the CPU, one thread. A funded customer launches the app through ``launch_app`` (1 × RTX 4090, the
licence accepted) like the app's page does; tasks run inline, so the call returns once the app's
health check answered (asked every ``APP_HEALTH_INTERVAL`` = 0.25 s here). The console is served
as the Procfile's ``web`` line serves it: uvicorn ``console.asgi:application`` in its own process
(the embedded settings on the same SQLite file). Every client is this process. The app binds port
8000 on the host (this machine): the run refuses to start when something else holds it.

1. Launch → app answering: --launches launches, each released after (the last one after part 2),
   each split into provisioning (order → running: ``running_at - created_at``) and app start
   (running → the health check answered: ``app_ready_at - running_at``: the server's start, the
   model's loading, and up to one health-check interval); the median and each value in seconds.
   No target: the figures are this machine's (a real model's loading dwarfs the tiny one's).
2. A streamed chat completion (``POST /v1/chat/completions``, ``stream: true``, the same prompt,
   ``max_tokens`` --max-tokens, temperature 0: greedy, so every answer is the same) through the
   console (``/apps/<instance>/v1/chat/completions`` on the uvicorn process: the key checked, a
   paramiko ``direct-tcpip`` channel over the console's pinned SSH connection) against the same
   server called directly (``http://127.0.0.1:8000/v1/chat/completions``), the same key as a
   bearer token, one keep-alive httpx client each, --reps each (after 2 warm-ups each, not
   counted), taking turns (the order swapped every round). First-token latency: from sending the
   request to the first SSE chunk with non-empty content (the role chunk, sent before generating,
   does not count); p50 in ms. Tokens: the usage's ``completion_tokens`` (the server sends it with
   ``stream_options.include_usage``; the content chunks are counted too and printed beside it);
   tokens/s: those tokens over the time from sending the request to the last content chunk (what
   the client sees of the stream); median. Printed beside it, not a target: the decode rate, the
   tokens after the first over the time from the first content chunk to the last (a path that
   holds chunks back and hands them on together shows a rate far above the server's). Targets:
   the proxy adds ≤ 10 ms to the first-token p50, and costs ≤ 5 % of the median tokens/s. A missed
   target is printed ("missed"), not an error: the exit status is non-zero only when something
   failed.
   Since the production edge (issue 34), the same completions go a third way, taking turns with
   the other two: through nginx (``console/edge.py``, as the Procfile's ``edge`` renders it, in
   front of the same uvicorn) on the app's own host ``<id>-8000.localhost`` with the owner's
   app-host cookie (the hand-off claimed as a browser's Open ends it): nginx asks the console
   (``auth_request``), then moves the bytes over the console's OpenSSH forward to the node, no
   Python in between. The same targets, printed for it against direct as well.

All of it shares this machine's cores: the console, sshd, the app's server and the clients. The
figures are this machine's; the differences are what the targets are about.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p).resolve() != ROOT / "bench")]

from bench.support.edge import start_edge, stop_edge  # noqa: E402
from bench.support.embedded import migrate_with_shipped_fleet, setup_embedded_django  # noqa: E402
from tests.support.servers import free_port, wait_healthy  # noqa: E402
from tests.support.sshd import (  # noqa: E402
    SshHostPool,
    configure_ssh_fleet,
    processes_under,
    sshd_available,
    stop_pids,
)

APP_SLUG = "llm-chat"
APP_PORT = 8000  # the manifest's: the server binds it on the host
APP_DIR = ROOT / "marketplace" / "apps" / APP_SLUG
RECIPE_PYTHON = ROOT / "var" / "recipe-venv" / "bin" / "python"
TINY = ROOT / "tests" / "marketplace" / "app_tiny.py"
# The driver's PATH on a node (slices.drivers.ssh.commands.NODE_PATH), the recipe venv before it.
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GPU_MODEL = "RTX4090"
HEALTH_INTERVAL_S = 0.25
FIRST_TOKEN_SLACK_MS = 10.0
RATE_LOSS = 0.05
WARM_UPS = 2
PROMPT = "hello please introduce yourself"
DIRECT_URL = f"http://127.0.0.1:{APP_PORT}/v1/chat/completions"


class BenchError(Exception):
    """Something failed (not a missed target): said, and the run exits non-zero."""


# ---------------------------------------------------------------------------------------------
# Set-up
# ---------------------------------------------------------------------------------------------


def port_free(port: int) -> bool:
    """Whether this machine's loopback ``port`` can be bound (as the app's server will)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_port_free(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not port_free(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@dataclass
class Setup:
    work: Path
    user: Any
    app: Any
    web_url: str
    web: subprocess.Popen[bytes]
    model_dir: Path
    edge_dir: Path  # the production edge's folder (nginx, the OpenSSH forwards)
    edge: subprocess.Popen[bytes]  # nginx in front of the console (issue 34)
    edge_port: int
    instances: list[Any] = field(default_factory=list)  # launched, not yet released


def set_up(work: Path, pool: SshHostPool) -> Setup:
    fleet_root = work / "fleet"
    env = {
        "SLICES_DRIVER": "ssh",
        "SLICES_SSH_USER": "root",
        "SLICES_SSH_KEY_FILE": str(pool.client_key),
        "SLICES_PFS_ROOT": str(fleet_root / "pfs"),
        "SLICES_ASSET_ROOT": str(fleet_root / "assets"),
        "SLICES_SSH_CONNECT_TIMEOUT": "10",
        "SLICES_SSH_COMMAND_TIMEOUT": "60",
        "SLICES_NODE_PATH": f"{RECIPE_PYTHON.parent}:{NODE_PATH}",
        "APP_HEALTH_INTERVAL": str(HEALTH_INTERVAL_S),
        # The image bakes the app at /opt/apps/llm-chat; a bare test host runs it from the checkout.
        "APP_EXTRA_ENV": json.dumps(
            {"APP_DIR": str(APP_DIR), "OMP_NUM_THREADS": "1", "HOME": str(work)}
        ),
        # The production edge's folder (issue 34): short, as its unix sockets' paths must be.
        "EDGE_DIR": tempfile.mkdtemp(prefix="gpce", dir="/tmp"),
    }
    # The same environment for this process and the console's (os.environ is inherited).
    setup_embedded_django(work, **env)
    t0 = time.perf_counter()
    migrate_with_shipped_fleet()
    from django.conf import settings

    from billing import services as billing
    from console.models import User
    from marketplace import aiapps
    from marketplace.services import load_catalogue
    from slices.choices import NodeState
    from slices.models import Gateway, Node

    load_catalogue()
    took = time.perf_counter() - t0
    app = aiapps.get_app(APP_SLUG)
    if app is None:
        raise BenchError(f"the app {APP_SLUG} is not shipped")
    nodes = Node.objects.filter(gpu_model__code=GPU_MODEL).order_by("cluster", "su__index", "index")
    node = nodes.first()
    assert node is not None
    nodes.exclude(pk=node.pk).update(state=NodeState.MAINTENANCE)
    # The shipped regions' SSH gateways are not part of this bench (no host of theirs runs).
    Gateway.objects.all().delete()
    host = pool.get(1)[0]
    fleet = configure_ssh_fleet(settings, [host], [node], fleet_root, client_key=pool.client_key)

    model_dir = fleet.asset_root / "models" / app.default_model
    t1 = time.perf_counter()
    made = subprocess.run(
        [str(RECIPE_PYTHON), str(TINY), "chat", str(model_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise BenchError(f"could not make the tiny chat model: {made.stderr[-2000:]}")
    tiny_s = time.perf_counter() - t1

    user = User.objects.create_user(username="bench", email="b@example.com", password="x" * 16)
    billing.grant_voucher(user, Decimal("10000"), reason="bench", valid_days=30)

    web_port = free_port()
    log = (work / "web.log").open("wb")
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "console.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(web_port),
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{web_port}"
    try:
        wait_healthy(url, timeout=60, alive=lambda: web.poll() is None)
    except RuntimeError as exc:
        web.kill()
        web.wait()
        log_text = (work / "web.log").read_text(errors="replace")[-3000:]
        raise BenchError(f"{exc}: {log_text}") from None
    edge_dir = Path(env["EDGE_DIR"])
    try:
        edge_port, edge_proc = start_edge(edge_dir, work, web_port)
    except RuntimeError as exc:
        raise BenchError(str(exc)) from None
    print(
        f"set-up (not measured: {took:.1f} s to migrate and load the shipped fleet and catalogue, "
        f"{tiny_s:.1f} s to make the tiny model): {app.slug} on {node.hostname} → sshd test host "
        f"127.0.0.1:{host.port} (runtime=process, {RECIPE_PYTHON.parent.parent.name}'s Python); "
        f"the tiny model at {model_dir.relative_to(work)}; the console: uvicorn "
        f"console.asgi:application at {url} (pid {web.pid}); the production edge: nginx "
        f"(console/edge.py) at http://127.0.0.1:{edge_port} in front of it (pid {edge_proc.pid})"
    )
    return Setup(work, user, app, url, web, model_dir, edge_dir, edge_proc, edge_port)


def app_cookie(instance: Any, port: int, user: Any) -> str:
    """The owner's Open, as the browser ends it: the one-time hand-off claimed on the app host,
    its grant in the app host's own cookie."""
    from slices.services import ports

    token = ports.handoff_token(instance, port, user_id=user.pk, link_id=None)
    grant = ports.claim_handoff(token, instance, port)
    assert grant is not None
    return f"{ports.APP_COOKIE}={ports.app_cookie_value(grant)}"


def _events(instance: Any) -> list[tuple[str, str, str]]:
    return list(instance.events.order_by("pk").values_list("code", "node", "text"))[-8:]


def release(setup: Setup, instance: Any) -> None:
    """Release the instance; its app's server must stop and free port 8000. One the release left
    running (a process under this run's folder) is said, stopped here, and counted an error."""
    from slices import services

    setup.instances = [i for i in setup.instances if i.pk != instance.pk]
    instance.refresh_from_db()
    services.release_instance(instance, by="bench")
    instance.refresh_from_db()
    if instance.state != "released":
        raise BenchError(f"{instance.slug} did not release: {instance.state}: {_events(instance)}")
    if wait_port_free(APP_PORT, 15):
        return
    left = [p for p in processes_under(setup.work) if _listens_on(p, APP_PORT)]
    stop_pids(left)
    raise BenchError(
        f"the release of {instance.slug} left port {APP_PORT} taken (pid "
        f"{', '.join(map(str, left)) or 'unknown'}, stopped here)"
    )


def _listens_on(pid: int, port: int) -> bool:
    """Whether ``pid`` holds a listening TCP socket on ``port`` (from /proc: no tools needed)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                listening = cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port
                if listening and cols[9] in inodes:
                    return True
    return False


# ---------------------------------------------------------------------------------------------
# 1. Launch → app answering
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    provisioning_s: float
    app_start_s: float
    call_s: float  # launch_app's wall time (it returns once the health check answered)

    @property
    def total_s(self) -> float:
        return self.provisioning_s + self.app_start_s


def launch(setup: Setup, index: int) -> tuple[Any, Launch]:
    from slices.services import apps

    started = time.perf_counter()
    instance = apps.launch_app(
        setup.user,
        setup.app,
        gpu_model=GPU_MODEL,
        cards=1,
        accept_license=True,
        name=f"bench-apps-{index}",
    )
    call_s = time.perf_counter() - started
    setup.instances.append(instance)
    instance.refresh_from_db()
    if instance.state != "running":
        raise BenchError(f"{instance.slug} ended {instance.state}: {_events(instance)}")
    if not apps.is_ready(instance):
        raise BenchError(f"{instance.slug}'s app did not answer: {_events(instance)}")
    if not instance.events.filter(code="app_ready").exists():
        raise BenchError(f"{instance.slug}: no app_ready event: {_events(instance)}")
    assert instance.running_at is not None and instance.app_ready_at is not None
    return instance, Launch(
        provisioning_s=(instance.running_at - instance.created_at).total_seconds(),
        app_start_s=(instance.app_ready_at - instance.running_at).total_seconds(),
        call_s=call_s,
    )


def bench_launches(setup: Setup, count: int) -> Any:
    """``count`` launches, each released after but the last (part 2 uses it): that instance."""
    print(
        f"\n1. Launch → app answering: {APP_SLUG} (1 × RTX 4090, the tiny model), {count} "
        f"launch(es), each released after (the last one after part 2)"
    )
    results: list[Launch] = []
    kept = None
    for i in range(count):
        instance, measured = launch(setup, i)
        results.append(measured)
        if i < count - 1:
            release(setup, instance)
        else:
            kept = instance
    rows = (
        ("provisioning (order → running)", [r.provisioning_s for r in results]),
        ("app start (running → answering)", [r.app_start_s for r in results]),
        ("launch → answering (the two)", [r.total_s for r in results]),
    )
    for label, values in rows:
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"   {label:<34} median {statistics.median(values):7.2f} s   (each: {each})")
    calls = ", ".join(f"{r.call_s:.2f}" for r in results)
    print(
        f"   (launch_app returned after {calls} s: it runs the order and the health check inline; "
        f"the health check is asked every {HEALTH_INTERVAL_S:g} s, so app start is known to "
        f"that; no target)"
    )
    return kept


# ---------------------------------------------------------------------------------------------
# 2. Streamed chat completion: through the console against direct
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    first_token_ms: float
    tokens: int  # the usage's completion_tokens
    chunks: int  # SSE chunks with non-empty content
    tokens_per_s: float  # tokens over request → last content chunk
    decode_per_s: float  # tokens after the first over first → last content chunk
    text: str


def stream_once(client: Any, url: str, key: str, body: dict[str, Any]) -> Sample:
    """One streamed completion, timed from sending the request to each content chunk."""
    first = last = 0.0
    chunks = 0
    tokens: int | None = None
    pieces: list[str] = []
    done = False
    started = time.perf_counter()
    with client.stream(
        "POST", url, headers={"Authorization": f"Bearer {key}"}, json=body
    ) as response:
        if response.status_code != 200:
            response.read()
            raise BenchError(f"POST {url}: HTTP {response.status_code}: {response.text[:500]}")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            payload = json.loads(data)
            if "error" in payload:
                raise BenchError(f"POST {url}: the stream said {payload['error']}")
            if payload.get("usage"):
                tokens = int(payload["usage"]["completion_tokens"])
            for choice in payload.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    chunks += 1
                    first = first or now
                    last = now
                    pieces.append(content)
    if not done or not chunks:
        raise BenchError(f"POST {url}: the stream ended without [DONE] or content ({chunks})")
    if tokens is None:
        raise BenchError(f"POST {url}: no usage in the stream (stream_options.include_usage)")
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else float("inf")
    rate = tokens / (last - started)
    return Sample((first - started) * 1000, tokens, chunks, rate, decode, "".join(pieces))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def bench_stream(setup: Setup, instance: Any, reps: int, max_tokens: int) -> None:
    import httpx

    proxy_url = f"{setup.web_url}/apps/{instance.public_id}/v1/chat/completions"
    key = instance.app_api_key
    body = {
        "model": instance.app_model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    print(
        f"\n2. Streamed chat completion: {PROMPT!r}, max_tokens {max_tokens}, temperature 0 "
        f"(greedy), {reps} each, taking turns (after {WARM_UPS} warm-ups each, not counted)"
    )
    edge_url = f"http://127.0.0.1:{setup.edge_port}/v1/chat/completions"
    edge_headers = {
        "Host": f"{instance.public_id}-{APP_PORT}.localhost:{setup.edge_port}",
        "Cookie": app_cookie(instance, APP_PORT, setup.user),
    }
    paths = {"direct": DIRECT_URL, "proxy": proxy_url, "edge": edge_url}
    samples: dict[str, list[Sample]] = {"direct": [], "proxy": [], "edge": []}
    with (
        httpx.Client(timeout=120) as direct,
        httpx.Client(timeout=120) as proxy,
        httpx.Client(timeout=120, headers=edge_headers) as edge,
    ):
        clients = {"direct": direct, "proxy": proxy, "edge": edge}
        for _ in range(WARM_UPS):
            for name in ("direct", "proxy", "edge"):
                stream_once(clients[name], paths[name], key, body)
        for i in range(reps):
            # Each way first, second and last in turn.
            order = [("direct", "proxy", "edge"), ("proxy", "edge", "direct"),
                     ("edge", "direct", "proxy")][i % 3]  # fmt: skip
            for name in order:
                samples[name].append(stream_once(clients[name], paths[name], key, body))
    everything = samples["direct"] + samples["proxy"] + samples["edge"]
    token_counts = sorted({s.tokens for s in everything})
    chunk_counts = sorted({s.chunks for s in everything})
    same = len({s.text for s in everything}) == 1
    print(
        f"   tokens = the usage's completion_tokens (stream_options.include_usage): "
        f"{'/'.join(map(str, token_counts))} per answer, in {'/'.join(map(str, chunk_counts))} "
        f"content chunks; the same answer every time every way: {'yes' if same else 'no'}"
    )
    first_p50 = {n: statistics.median(s.first_token_ms for s in samples[n]) for n in samples}
    rate = {n: statistics.median(s.tokens_per_s for s in samples[n]) for n in samples}
    decode = {n: statistics.median(s.decode_per_s for s in samples[n]) for n in samples}
    for name, label in (
        ("direct", f"direct (127.0.0.1:{APP_PORT})"),
        ("proxy", "through the console's proxy"),
        ("edge", "through the edge (nginx)"),
    ):
        values = [s.first_token_ms for s in samples[name]]
        print(
            f"   {label:<28} first token p50 {first_p50[name]:7.2f} ms (p90 "
            f"{_pct(values, 0.9):.2f}, min {min(values):.2f}, max {max(values):.2f})   "
            f"tokens/s median {rate[name]:7.1f}   n={len(values)}"
        )
    print(
        f"   (not a target: the decode rate, first → last content chunk, median: direct "
        f"{decode['direct']:.1f}, through the proxy {decode['proxy']:.1f}, through the edge "
        f"{decode['edge']:.1f} tokens/s)"
    )
    for name, label in (("proxy", "the proxy"), ("edge", "the edge")):
        added = first_p50[name] - first_p50["direct"]
        loss = 1 - rate[name] / rate["direct"]
        print(
            f"   {label}: first token {added:+.2f} ms against direct (p50), tokens/s "
            f"{-loss:+.1%} (median)"
        )
        first_ok = added <= FIRST_TOKEN_SLACK_MS
        rate_ok = loss <= RATE_LOSS
        print(
            f"   target: {label} adds ≤ {FIRST_TOKEN_SLACK_MS:.0f} ms to the first-token p50: "
            f"{added:+.2f} ms, {'met' if first_ok else 'missed'}"
        )
        print(
            f"   target: {label} costs ≤ {RATE_LOSS:.0%} of tokens/s: {loss:.1%}, "
            f"{'met' if rate_ok else 'missed'}"
        )


# ---------------------------------------------------------------------------------------------


def tear_down(setup: Setup | None, pool: SshHostPool, work: Path) -> list[str]:
    """Release what is left, stop the console, sshd and anything under ``work``: the problems."""
    problems: list[str] = []
    if setup is not None:
        for instance in list(setup.instances):
            try:
                release(setup, instance)
            except Exception as exc:  # noqa: BLE001 - every problem is said; cleaning goes on
                problems.append(f"release: {exc}")
        setup.web.terminate()
        try:
            setup.web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            setup.web.kill()
            setup.web.wait()
        stop_edge(setup.edge, setup.edge_dir)
    pool.stop()
    left = processes_under(work)
    if left:
        print(f"note: stopping {len(left)} process(es) left under {work}: {left}")
        if stop_pids(left):
            problems.append(f"could not stop {left}")
    shutil.rmtree(work, ignore_errors=True)
    if not wait_port_free(APP_PORT, 5):
        problems.append(f"port {APP_PORT} is still taken after the run")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--launches", type=int, default=3, help="launches of the app (3)")
    parser.add_argument("--reps", type=int, default=20, help="completions each way (20)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each (64)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1 launch, 3 completions each way of 16 tokens",
    )
    args = parser.parse_args()
    if args.quick:
        args.launches, args.reps, args.max_tokens = 1, 3, 16
    if args.launches < 1 or args.reps < 1 or args.max_tokens < 2:
        parser.error("--launches and --reps must be ≥ 1, --max-tokens ≥ 2")
    if not sshd_available():
        print("not run: needs /usr/sbin/sshd (openssh-server) and root", file=sys.stderr)
        return 1
    if not RECIPE_PYTHON.exists():
        print(
            f"not run: {RECIPE_PYTHON.parent.parent} is missing (make recipe-env): the app's "
            "server needs its torch and Transformers",
            file=sys.stderr,
        )
        return 1
    if not port_free(APP_PORT):
        print(
            f"not run: port {APP_PORT} is taken on this machine (the chat app's server binds "
            f"127.0.0.1:{APP_PORT} on the test host, which is this machine): stop what listens "
            f"there (`ss -ltnp 'sport = :{APP_PORT}'`) and run again",
            file=sys.stderr,
        )
        return 1

    work = Path(tempfile.mkdtemp(prefix="bench-apps-"))
    pool = SshHostPool(work / "sshd")
    setup: Setup | None = None
    failed: str | None = None
    try:
        setup = set_up(work, pool)
        kept = bench_launches(setup, args.launches)
        bench_stream(setup, kept, args.reps, args.max_tokens)
    except BenchError as exc:
        failed = str(exc)
    finally:
        problems = tear_down(setup, pool, work)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    print(
        f"\n(all on this machine's {os.cpu_count()} cores, shared by the console, sshd, the app's "
        f"server and the clients; load average now {os.getloadavg()[0]:.1f}"
        + ("" if problems else f"; the app's server stopped, port {APP_PORT} free")
        + ")"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
