"""Load benchmark: the production stack as ``make prod`` runs it, under many users at once.

    .venv/bin/python bench/load.py                  # the full run: 5 minutes at the counts below
    .venv/bin/python bench/load.py --duration 120   # the same load, 2 minutes
    .venv/bin/python bench/load.py --quick          # a 30 s smoke run, a tenth of the users (the test)
    .venv/bin/python bench/load.py --capacity-only --wsgi --step-seconds 2   # the curves alone

Every client goes through the Procfile's edge (nginx, issue 34); ``--direct`` sends them straight
to the web processes instead.

The stack (bench/support/production.py): a fresh PostgreSQL database next to ``DATABASE_URL``'s
(or 127.0.0.1:5432), a private redis-server, ``collectstatic``, then every Procfile line as honcho
starts it: uvicorn with ``WEB_CONCURRENCY`` (2) worker processes, the Celery worker (prefork,
``CELERY_CONCURRENCY`` 4), beat (settlement every minute, the reconciler every 30 s) and the
telemetry relay; the simulated fleet at ``SIM_TIME_SCALE=0.02`` so orders run within seconds. Any
``DB_*`` setting in the environment reaches the stack. Set-up is not measured: the shipped fleet
and catalogue, 50 funded customers, each with a browser session (a session cookie made on the
server: password hashing would cost the machine a minute), API tokens and one running 1-card host.

The load, from this process (one asyncio loop on uvloop, httpx and websockets; its CPU is printed):

- 200 API clients, each with its own token and connection, polling on a steady 1 s cadence
  (no burst when late) their instance list, their wallet and their instance, in turn;
- 100 telemetry websockets on the customers' running instances (their owners' cookies), each
  acknowledging every sample as the page does once it has drawn it, reconnecting with the page's
  back-off after a close;
- 50 browser sessions paging through the dashboard, the instance list, their instance's page and
  the marketplace (list pages 1-3, a model's page), 2-6 s of reading between pages (a GET whose
  kept-alive connection the server closed meanwhile is sent again once, as browsers do);
- 10 orders a minute through the API (a 1-card host, an Idempotency-Key), each tick releasing the
  oldest ordered instance that reached running.

Printed: requests/s, p50/p99 per route and route group, errors by route and status (any answer
other than the expected one, any transport error, a websocket closed or refused, an ordered
instance that failed, a stack process that exited), the telemetry interval (time between
consecutive samples on one socket) p50/p99 and the longest gap, the peak PostgreSQL connections
to the database (pg_stat_activity every second; the server's total too, as other clients share
its max_connections) and how many are still open 10 s after the load, CPU per process and the web's
CPU per request, the commonest exceptions in the processes' logs; then the targets: no errors,
API p99 < 500 ms at >= 150 API requests/s (75 % of the offered rate with other counts), telemetry
interval p99 < 1.5 s, the peak within the connection budget (``--budget``, else
``DB_CONNECTION_BUDGET`` from the settings, else README "Database connections": the pool's
``max_size`` per web process plus one connection per worker child and the relay; without a pool,
the peak is only shown).

Then the capacity curves (issue 34; ``--no-capacity``: none; ``--capacity-only``: only them),
``bench/support/capacity.py``: open-loop steps of ``--step-seconds`` (3; ``--quick`` 1) at rising
offered rates, after one step of warm-up, for an instance read (``GET /api/v1/instances/<id>/``
with a token) and for a trivial answer on the same path (``GET /api/v1/``, the public API root: the
same edge, server and handler, no database), each up to the highest offered rate whose p99 stays
under 500 ms with no errors (a miss is run once more to confirm it), the load generator's CPU
printed beside every step and figure; the target: the read's capacity >= 0.5 of the trivial one's.
``--wsgi`` adds the same curves against ``console.wsgi`` under uvicorn's WSGI interface (as many
processes as the web, behind an edge of its own) on the same database and Redis, the two servers'
curves alternating. The last line, ``summary: {...}``, is the figures as JSON. Exit status 1 when a
run other than ``--quick`` misses a target (``make bench`` stops there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import ssl
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p).resolve() != ROOT / "bench")]

from bench.support import capacity  # noqa: E402
from bench.support.http1 import ConnectionLost, LeanClient  # noqa: E402
from bench.support.production import (  # noqa: E402
    ProductionStack,
    machine_busy_seconds,
    procfile,
    production_stack,
)
from tests.support import servers  # noqa: E402

API_P99_TARGET_MS = 500.0
# 150 requests/s from the 200 clients polling every second: 75 % of the offered rate, which
# a run with other counts is held to.
API_RATE_TARGET = 150.0
API_RATE_SHARE = API_RATE_TARGET / 200.0
TELEMETRY_P99_TARGET_S = 1.5
ACK = '{"kind":"ack"}'
SAMPLE_PREFIX = '{"kind":"sample"'
GROUPS = ("api", "page", "order", "ws")
# The instance read's capacity against the same stack's own limit (a trivial API answer), issue 34.
CAPACITY_SHARE_TARGET = 0.5
TRIVIAL_PATH = "/api/v1/"  # the API root: public, no database, through the same handler and edge


@dataclass
class Plan:
    api_clients: int = 200
    api_interval: float = 1.0  # seconds between one client's polls
    sockets: int = 100
    browsers: int = 50
    think: tuple[float, float] = (2.0, 6.0)  # seconds a browser reads a page
    orders_per_minute: float = 10.0
    duration: float = 300.0  # measured seconds
    warmup: float = 15.0  # seconds of load before the measurement starts
    settle: float = 10.0  # seconds after the load before the last connection count
    sim_time_scale: float = 0.02
    # Every client through the Procfile's edge (nginx in front, issue 34) rather than straight to
    # the web processes (--direct).
    through_edge: bool = True
    mixed: bool = True  # the mixed load above (off: --capacity-only)
    # The capacity curves after it (bench/support/capacity.py; off: --no-capacity).
    capacity: bool = True
    step_seconds: float = 3.0
    rates: tuple[float, float, float] = (20.0, 3000.0, 1.25)  # from, up to, by x
    # The same curves against the API served by WSGI (uvicorn's WSGI interface, console.wsgi,
    # behind an edge of its own) beside the Procfile's ASGI web.
    wsgi: bool = False

    @property
    def customers(self) -> int:
        return max(1, self.browsers)


QUICK = Plan(
    api_clients=20,
    sockets=10,
    browsers=5,
    duration=30.0,
    warmup=5.0,
    settle=5.0,
    step_seconds=1.0,
    rates=(20.0, 160.0, 2.0),
)


# ---------------------------------------------------------------------------------------------
# Set-up (inside the stack's database, through manage.py shell)
# ---------------------------------------------------------------------------------------------

SETUP = r"""
import json, os
from decimal import Decimal
from importlib import import_module
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from billing import services as billing
from console import services as console
from console.models import User
from marketplace.models import Asset
from slices import services

plan = json.loads(os.environ["LOAD_PLAN"])
store = import_module(settings.SESSION_ENGINE).SessionStore
customers = []
for i in range(plan["customers"]):
    user = User.objects.create_user(username=f"load-{i}", email=f"load-{i}@example.com")
    billing.grant_voucher(user, Decimal("100000"), reason="load bench", valid_days=30)
    session = store()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    tokens = [console.create_api_token(user, name=f"load {j}")[1] for j in range(plan["tokens"])]
    instance, _ = services.order_instance(
        user, services.OrderRequest(gpu_model="RTX4090", cards=1, name=f"load-{i}")
    )
    customers.append(
        {"session": session.session_key, "tokens": tokens, "instance": str(instance.public_id)}
    )
models = list(Asset.objects.filter(kind="model").order_by("id").values_list("slug", flat=True)[:20])
database = settings.DATABASES["default"]
print(json.dumps({
    "customers": customers,
    "cookie": settings.SESSION_COOKIE_NAME,
    "models": models,
    "db": {
        "DB_CONNECTION_BUDGET": getattr(settings, "DB_CONNECTION_BUDGET", None),
        "pool": (database.get("OPTIONS") or {}).get("pool"),
        "conn_max_age": database.get("CONN_MAX_AGE"),
        "settings": {k: getattr(settings, k) for k in dir(settings) if k.startswith("DB_")},
    },
}, default=str))
"""


def _setup(prod: ProductionStack, plan: Plan) -> dict[str, Any]:
    tokens = math.ceil(plan.api_clients / plan.customers)
    out = prod.manage(
        "shell",
        "-c",
        SETUP,
        LOAD_PLAN=json.dumps({"customers": plan.customers, "tokens": tokens}),
    )
    return json.loads(out.strip().splitlines()[-1])


def _query(prod: ProductionStack, sql: str, *args: object) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(prod.database_url, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def _wait_running(prod: ProductionStack, ids: list[str], timeout: float) -> None:
    """Until every set-up instance runs (the worker provisions them once it has started)."""
    import psycopg

    deadline = time.monotonic() + timeout
    states: Counter[str] = Counter()
    while True:
        try:
            rows = _query(
                prod, "SELECT state FROM slices_instance WHERE public_id::text = ANY(%s)", ids
            )
            states = Counter(state for (state,) in rows)
        except psycopg.OperationalError:  # a shared server may be full a moment: ask again
            pass
        if states["running"] == len(ids):
            return
        if states["failed"] or time.monotonic() > deadline:
            raise SystemExit(
                f"set-up instances did not all run: {dict(states)}\n{prod.stack.logs()}"
            )
        time.sleep(0.5)


def connection_budget(db: dict[str, Any], env: dict[str, str]) -> tuple[int | None, str]:
    """The documented connection budget of one host running the Procfile (README "Database
    connections") and where it comes from: ``DB_CONNECTION_BUDGET`` if the settings have one;
    else, with a pool, its ``max_size`` per web process plus one connection per process of the
    Procfile lines that run without the pool (``DB_POOL=false``: their queries run on one thread),
    the worker's ``CELERY_CONCURRENCY`` children each, beat none (it only publishes jobs)."""
    if db.get("DB_CONNECTION_BUDGET") not in (None, "", "None"):
        return int(db["DB_CONNECTION_BUDGET"]), "settings.DB_CONNECTION_BUDGET"
    pool = db.get("pool")
    if not isinstance(pool, dict):
        return None, "no pool configured and no DB_CONNECTION_BUDGET setting"
    size = int(pool.get("max_size") or pool.get("min_size") or 4)  # psycopg_pool's default
    counts = {
        "web": int(env.get("WEB_CONCURRENCY", "2")),
        "worker": int(env.get("CELERY_CONCURRENCY", "4")),
        "beat": 0,
        "edge": 0,  # nginx (issue 34): no database
    }
    total, parts = 0, []
    for name, command in procfile().items():
        processes = counts.get(name, 1)
        each = 1 if "DB_POOL=false" in command else size
        total += processes * each
        parts.append(f"{name} {processes} x {each}")
    return total, f"pool max_size {size}: {', '.join(parts)}"


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


@dataclass
class Recorder:
    """What the clients saw; only what started inside the measured window counts."""

    start: float = math.inf
    end: float = math.inf
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter[str] = field(default_factory=Counter)
    intervals: list[float] = field(default_factory=list)
    max_gap: float = 0.0
    samples: int = 0
    silent_sockets: int = 0
    reconnects: int = 0
    retried: int = 0  # GETs sent again on a kept-alive connection the server had closed
    orders: Counter[str] = field(default_factory=Counter)
    # Requests slower than the API's p99 target, by the second of the window they were sent in:
    # whether the slow ones are spread or bunched (a stall) shows here.
    slow: Counter[int] = field(default_factory=Counter)
    order_seconds: list[int] = field(default_factory=list)  # when each order tick began

    def counting(self, t: float) -> bool:
        return self.start <= t < self.end

    def request(self, route: str, t0: float, outcome: int | str, expected: tuple[int, ...]) -> bool:
        ok = outcome in expected
        if self.counting(t0):
            ms = (time.monotonic() - t0) * 1000
            self.latency[route].append(ms)
            if ms > API_P99_TARGET_MS:
                self.slow[int(t0 - self.start)] += 1
            if not ok:
                self.errors[f"{route} {outcome}"] += 1
        return ok

    def error(self, what: str, t: float) -> None:
        if self.counting(t):
            self.errors[what] += 1


async def _request(
    client: Any,
    rec: Recorder,
    route: str,
    method: str,
    path: str,
    expected: tuple[int, ...] = (200,),
    **kwargs: Any,
) -> Any:
    """One timed request; the response when it answered as expected, else None (an error).

    A GET whose kept-alive connection the server closed just as it was sent (uvicorn closes
    idle ones after 5 s, a reader's pause is 2-6 s) is sent again once, as browsers do; counted
    in ``retried``, the time of both in the latency."""
    import httpx

    t0 = time.monotonic()
    response = None
    for attempt in (1, 2):
        try:
            response = await client.request(method, path, **kwargs)
            outcome: int | str = response.status_code
            break
        except (httpx.RemoteProtocolError, httpx.ReadError, ConnectionLost) as exc:
            outcome = type(exc).__name__
            if method != "GET" or attempt == 2:
                break
            if rec.counting(t0):
                rec.retried += 1
        except (httpx.HTTPError, OSError, TimeoutError) as exc:
            outcome = type(exc).__name__
            break
    return response if rec.request(route, t0, outcome, expected) else None


def _client(url: str, tls: ssl.SSLContext, **kwargs: Any) -> Any:
    import httpx

    return httpx.AsyncClient(
        base_url=url,
        timeout=30,
        verify=tls,  # one context for all (loading the CA bundle per client costs CPU)
        trust_env=False,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        **kwargs,
    )


async def _steady(interval: float, until: float, step: Any) -> None:
    """Call ``step`` every ``interval`` seconds until ``until``; late calls are not caught up."""
    next_at = time.monotonic()
    while time.monotonic() < until:
        await step()
        next_at += interval
        delay = next_at - time.monotonic()
        if delay < 0:
            next_at, delay = time.monotonic(), 0
        await asyncio.sleep(delay)


async def api_client(
    url: str,
    tls: ssl.SSLContext,
    token: str,
    instance: str,
    rec: Recorder,
    plan: Plan,
    until: float,
) -> None:
    routes = (
        ("api:instances", "/api/v1/instances/"),
        ("api:wallet", "/api/v1/billing/wallet/"),
        ("api:instance", f"/api/v1/instances/{instance}/"),
    )
    turn = random.randrange(len(routes))
    # 200 of them: the lean client (bench/support/http1.py) keeps the generator's CPU low.
    headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
    lean = url.startswith("http://")
    async with (
        LeanClient(url, headers=headers) if lean else _client(url, tls, headers=headers)
    ) as client:

        async def step() -> None:
            nonlocal turn
            route, path = routes[turn % len(routes)]
            turn += 1
            await _request(client, rec, route, "GET", path)

        await asyncio.sleep(random.uniform(0, plan.api_interval))
        await _steady(plan.api_interval, until, step)


async def browser(
    url: str,
    tls: ssl.SSLContext,
    cookie: dict[str, str],
    instance: str,
    models: list[str],
    rec: Recorder,
    plan: Plan,
    until: float,
) -> None:
    headers = {"User-Agent": "Mozilla/5.0 (load bench)", "Accept": "text/html"}
    async with _client(url, tls, headers=headers, cookies=cookie) as client:
        await asyncio.sleep(random.uniform(0, plan.think[1]))
        visit = 0
        while time.monotonic() < until:
            pages = (
                ("page:dashboard", "/"),
                ("page:instances", "/instances/"),
                ("page:instance", f"/instances/{instance}/"),
                ("page:marketplace", f"/marketplace/?page={visit % 3 + 1}"),
                ("page:model", f"/marketplace/models/{models[visit % len(models)]}/")
                if models
                else ("page:marketplace", "/marketplace/"),
            )
            for route, path in pages:
                if time.monotonic() >= until:
                    return
                await _request(client, rec, route, "GET", path)
                await asyncio.sleep(random.uniform(*plan.think))
            visit += 1


async def telemetry_socket(
    ws_url: str, headers: dict[str, str], rec: Recorder, until: float
) -> None:
    """One instance page's live chart (static/slices/telemetry.js): every sample acknowledged as
    drawn; after a close, reconnect with its back-off (1 s doubling to 15 s, jittered, reset by
    the server's hello), none after 4401/4403/4404."""
    import websockets

    last: float | None = None  # kept across reconnects: the gap a reader sees includes them
    counted = 0
    delay = 1.0
    while True:
        t0 = time.monotonic()
        try:
            async with websockets.connect(
                ws_url, additional_headers=headers, ping_interval=None, open_timeout=30
            ) as ws:
                rec.request("ws:connect", t0, 101, (101,))
                while True:
                    remaining = until - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        raw = await asyncio.wait_for(ws.recv(), timeout=remaining)
                    except TimeoutError:
                        break
                    if not isinstance(raw, str):
                        continue
                    if raw.startswith('{"kind":"hello"'):
                        delay = 1.0
                    if not raw.startswith(SAMPLE_PREFIX):
                        continue
                    now = time.monotonic()
                    await ws.send(ACK)
                    if last is not None and rec.counting(last):
                        rec.intervals.append(now - last)
                        rec.max_gap = max(rec.max_gap, now - last)
                    if rec.counting(now):
                        counted += 1
                        rec.samples += 1
                    last = now
            break  # the run is over
        except websockets.ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else "none"
            rec.error(f"ws:telemetry closed {code}", time.monotonic())
            if code in (4401, 4403, 4404):
                break
        except websockets.InvalidStatus as exc:
            rec.request("ws:connect", t0, exc.response.status_code, (101,))
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            rec.request("ws:connect", t0, type(exc).__name__, (101,))
        wait = delay / 2 + random.random() * delay / 2
        delay = min(delay * 2, 15.0)
        if time.monotonic() + wait >= until:
            break
        await asyncio.sleep(wait)
        if rec.counting(time.monotonic()):
            rec.reconnects += 1
    if last is not None and rec.counting(last):  # a socket stalled at the end counts too
        rec.max_gap = max(rec.max_gap, rec.end - last)
    if counted == 0:
        rec.silent_sockets += 1


async def orderer(
    url: str,
    tls: ssl.SSLContext,
    customers: list[dict[str, Any]],
    rec: Recorder,
    plan: Plan,
    until: float,
) -> None:
    """``orders_per_minute`` orders; each tick also releases the oldest order that is running."""
    ordered: deque[tuple[str, str]] = deque()  # (public id, token) not yet released
    n = 0
    async with _client(url, tls) as client:

        async def step() -> None:
            nonlocal n
            token = customers[n % len(customers)]["tokens"][0]
            n += 1
            if rec.counting(time.monotonic()):
                rec.order_seconds.append(int(time.monotonic() - rec.start))
            auth = {"Authorization": f"Token {token}"}
            response = await _request(
                client,
                rec,
                "order:create",
                "POST",
                "/api/v1/instances/",
                (202,),
                json={"gpu_model": "RTX4090", "cards": 1, "name": f"load-order-{n}"},
                headers={**auth, "Idempotency-Key": uuid.uuid4().hex},
            )
            if response is not None:
                ordered.append((response.json()["id"], token))
                rec.orders["placed"] += 1
            for public_id, owner in list(ordered):
                answer = await _request(
                    client,
                    rec,
                    "order:poll",
                    "GET",
                    f"/api/v1/instances/{public_id}/",
                    headers={"Authorization": f"Token {owner}"},
                )
                state = answer.json()["state"] if answer is not None else ""
                if state == "failed":
                    ordered.remove((public_id, owner))
                    rec.orders["failed"] += 1
                    rec.error("order: instance failed", time.monotonic())
                elif state == "running":
                    ordered.remove((public_id, owner))
                    rec.orders["running"] += 1
                    released = await _request(
                        client,
                        rec,
                        "order:release",
                        "POST",
                        f"/api/v1/instances/{public_id}/release/",
                        (202,),
                        headers={"Authorization": f"Token {owner}"},
                    )
                    rec.orders["released"] += released is not None
                    break  # one release per tick
            rec.orders["pending at the end"] = len(ordered)

        await asyncio.sleep(random.uniform(0, 60.0 / plan.orders_per_minute))
        await _steady(60.0 / plan.orders_per_minute, until, step)


class PgSampler(threading.Thread):
    """pg_stat_activity of the stack's database every second, from the server's own database."""

    def __init__(self, database_url: str) -> None:
        super().__init__(daemon=True)
        parts = urlsplit(database_url)
        self.name_ = parts.path.lstrip("/")
        self.admin = urlunsplit(parts._replace(path="/postgres"))
        self.samples: list[tuple[float, int, int, int]] = []  # (t, ours, ours active, server)
        self.stop = threading.Event()
        self.max_connections = 0
        self.failures = 0  # seconds the sampler could not connect

    def count(self, conn: Any) -> tuple[int, int, int]:
        """Connections to the stack's database, those of them not idle, and the server's all
        (a shared server: other clients' connections count against max_connections too)."""
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE datname = %s), "
            "count(*) FILTER (WHERE datname = %s AND state <> 'idle'), "
            "count(*) FILTER (WHERE backend_type = 'client backend') FROM pg_stat_activity",
            (self.name_, self.name_),
        ).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def run(self) -> None:
        import psycopg

        while not self.stop.is_set():
            try:
                with psycopg.connect(self.admin, autocommit=True) as conn:
                    row = conn.execute("SHOW max_connections").fetchone()
                    self.max_connections = int(row[0]) if row else 0
                    while not self.stop.is_set():
                        self.samples.append((time.monotonic(), *self.count(conn)))
                        self.stop.wait(1.0)
            except psycopg.OperationalError:  # the server full or restarting: a gap, then again
                self.failures += 1
                self.stop.wait(1.0)

    def peak(self, start: float, end: float) -> tuple[int, int, int]:
        """The highest of each count between ``start`` and ``end``."""
        inside = [s[1:] for s in self.samples if start <= s[0] <= end] or [(0, 0, 0)]
        return max(s[0] for s in inside), max(s[1] for s in inside), max(s[2] for s in inside)


async def drive(
    prod: ProductionStack, data: dict[str, Any], plan: Plan, rec: Recorder
) -> dict[str, Any]:
    """All the clients at once; CPU and the window's bounds around the measured part."""
    url = f"http://{prod.env['EDGE_LISTEN']}" if plan.through_edge else prod.url
    tls = ssl.create_default_context()
    customers = data["customers"]
    started = time.monotonic()
    rec.start = started + plan.warmup
    rec.end = until = rec.start + plan.duration
    tasks = []
    for i in range(plan.api_clients):
        c = customers[i % len(customers)]
        token = c["tokens"][i // len(customers)]
        tasks.append(api_client(url, tls, token, c["instance"], rec, plan, until))
    for c in customers[: plan.browsers]:
        cookie = {data["cookie"]: c["session"]}
        tasks.append(browser(url, tls, cookie, c["instance"], data["models"], rec, plan, until))
    ws_base = url.replace("http://", "ws://")
    for i in range(plan.sockets):
        c = customers[i % len(customers)]
        headers = {"Cookie": f"{data['cookie']}={c['session']}", "Origin": url}
        path = f"/ws/telemetry/instances/{c['instance']}/"
        tasks.append(telemetry_socket(ws_base + path, headers, rec, until))
    if plan.orders_per_minute > 0:
        tasks.append(orderer(url, tls, customers, rec, plan, until))

    async def measure() -> dict[str, Any]:
        await asyncio.sleep(max(0.0, rec.start - time.monotonic()))
        before = (time.process_time(), prod.cpu_seconds(), machine_busy_seconds())
        await asyncio.sleep(max(0.0, rec.end - time.monotonic()))
        wall = time.monotonic() - rec.start
        stack = prod.cpu_seconds()
        return {
            "wall": wall,
            "generator": (time.process_time() - before[0]) / wall,
            "stack": {k: (v - before[1].get(k, 0.0)) / wall for k, v in stack.items()},
            "machine": (machine_busy_seconds() - before[2]) / wall,
        }

    results = await asyncio.gather(measure(), *tasks, return_exceptions=True)
    failures = [r for r in results[1:] if isinstance(r, BaseException)]
    for failure in failures[:3]:
        print(f"a client crashed: {failure!r}", file=sys.stderr)
    rec.errors.update({"load generator: client crashed": len(failures)} if failures else {})
    if isinstance(results[0], BaseException):
        raise results[0]
    return results[0]


# ---------------------------------------------------------------------------------------------
# Capacity curves (issue 34)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurveTarget:
    kind: str  # "read": an instance through the API with its owner's token; "trivial": the API root
    server: str  # "ASGI" (the Procfile's web) or "WSGI"
    path: str  # "edge" or "direct"
    url: str

    @property
    def name(self) -> str:
        return f"{self.kind} ({self.server}, {self.path})"


def _wsgi_processes(prod: ProductionStack, work: Path, workers: str) -> tuple[str, str]:
    """The API served by WSGI beside the Procfile's ASGI web, on the same database and Redis:
    ``console.wsgi`` under uvicorn's WSGI interface (threads; gunicorn is not a dependency), as
    many processes as the web, and an edge of its own (``manage.py edge``, its own folder) in
    front of it. Their direct and edge URLs."""
    port, edge = servers.free_port(), f"127.0.0.1:{servers.free_port()}"
    prod.stack.spawn(
        "wsgi",
        str(servers.BIN / "uvicorn"),
        "console.wsgi:application",
        "--interface",
        "wsgi",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        workers,
        "--proxy-headers",
    )
    prod.stack.spawn(
        "edge-wsgi",
        "/bin/sh",
        "-c",
        f"EDGE_DIR={work / 'edge-wsgi'} exec {servers.BIN / 'python'} manage.py edge "
        f"--listen {edge} --web 127.0.0.1:{port}",
    )
    direct = f"http://127.0.0.1:{port}"
    servers.wait_healthy(direct, timeout=120)
    servers.wait_healthy(f"http://{edge}", timeout=60)
    return direct, f"http://{edge}"


def capacity_targets(
    prod: ProductionStack, plan: Plan, wsgi: tuple[str, str] | None
) -> list[CurveTarget]:
    path = "edge" if plan.through_edge else "direct"
    asgi = f"http://{prod.env['EDGE_LISTEN']}" if plan.through_edge else prod.url
    servers_ = [("ASGI", asgi)]
    if wsgi is not None:
        servers_.append(("WSGI", wsgi[1] if plan.through_edge else wsgi[0]))
    # ASGI and WSGI alternate, so a change in the shared machine's load falls on both alike.
    return [CurveTarget(k, s, path, url) for k in ("read", "trivial") for s, url in servers_]


async def _curve(
    target: CurveTarget, data: dict[str, Any], plan: Plan
) -> list[capacity.StepResult]:
    customers = data["customers"]
    turn = iter(range(1 << 30))

    def connect() -> LeanClient:
        if target.kind == "read":  # the customers in turn, each connection its own token
            c = customers[next(turn) % len(customers)]
            headers = {"Authorization": f"Token {c['tokens'][0]}", "Accept": "application/json"}
            client = LeanClient(target.url, headers=headers)
            client.path = f"/api/v1/instances/{c['instance']}/"  # type: ignore[attr-defined]
        else:
            client = LeanClient(target.url, headers={"Accept": "application/json"})
            client.path = TRIVIAL_PATH  # type: ignore[attr-defined]
        return client

    async def send(client: LeanClient) -> int:
        path = client.path  # type: ignore[attr-defined]
        try:
            return (await client.request("GET", path)).status_code
        except ConnectionLost:
            # A kept-alive connection the server closed as the GET left: sent again once on a
            # new one, as any client does (the time of both counts).
            return (await client.request("GET", path)).status_code

    async def close(client: LeanClient) -> None:
        await client.aclose()

    start, stop, factor = plan.rates
    return await capacity.curve(
        capacity.ConnectionPool(connect, close),
        send,
        capacity.step_rates(start, stop, factor),
        plan.step_seconds,
        on_step=lambda step: print(capacity.format_step(target.name, step), flush=True),
        warmup=plan.step_seconds,  # each process's first requests prepare its statements
        confirm=1,  # the machine is shared: a miss is run again before the curve stops there
    )


def run_capacity(
    prod: ProductionStack, data: dict[str, Any], plan: Plan, work: Path
) -> dict[str, Any]:
    """Every curve, one after the other, and the figures: each one's capacity (the highest offered
    rate with p99 < 500 ms and no errors) with the generator's CPU at that step, the read's share
    of the trivial answer's (the stack's own limit), and WSGI's against ASGI's when measured."""
    wsgi = _wsgi_processes(prod, work, prod.env.get("WEB_CONCURRENCY", "2")) if plan.wsgi else None
    print(
        f"\ncapacity curves: open-loop steps of {plan.step_seconds:g} s from "
        f"{plan.rates[0]:g} requests/s, x{plan.rates[2]:g} a step up to {plan.rates[1]:g}, "
        f"after {plan.step_seconds:g} s of warm-up, until p99 >= {capacity.P99_TARGET_MS:.0f} ms "
        f"or an error (a miss is run once more to confirm it); read = GET "
        f"/api/v1/instances/<id>/ with a token, trivial = GET {TRIVIAL_PATH} (public, no database)"
        + (
            "; WSGI: console.wsgi under uvicorn --interface wsgi behind an edge of its own"
            if wsgi
            else ""
        ),
        flush=True,
    )
    curves: dict[str, Any] = {}
    for target in capacity_targets(prod, plan, wsgi):
        steps = _run(_curve(target, data, plan))
        best = capacity.highest_passing(steps)
        curves[target.name] = {
            "kind": target.kind,
            "server": target.server,
            "path": target.path,
            "capacity_rps": best.offered if best else 0.0,
            "generator_cpu": best.generator_cpu if best else math.nan,
            "steps": [s.as_dict() for s in steps],
        }
    return capacity_figures(curves)


def capacity_figures(curves: dict[str, Any]) -> dict[str, Any]:
    """The ratios the issue asks for, from the curves' capacities."""
    by = {(c["kind"], c["server"]): c for c in curves.values()}
    ratios: dict[str, float] = {}
    for server in ("ASGI", "WSGI"):
        read, trivial = by.get(("read", server)), by.get(("trivial", server))
        if read and trivial:
            ratios[f"read/trivial {server}"] = (
                read["capacity_rps"] / trivial["capacity_rps"] if trivial["capacity_rps"] else 0.0
            )
    for kind in ("read", "trivial"):
        asgi, wsgi = by.get((kind, "ASGI")), by.get((kind, "WSGI"))
        if asgi and wsgi:
            ratios[f"{kind} WSGI/ASGI"] = (
                wsgi["capacity_rps"] / asgi["capacity_rps"] if asgi["capacity_rps"] else math.inf
            )
    return {"curves": curves, "ratios": ratios}


def report_capacity(cap: dict[str, Any]) -> dict[str, bool]:
    print("capacity (the highest offered rate with p99 < 500 ms and no errors):")
    for name, c in cap["curves"].items():
        print(
            f"  {name:<22} {c['capacity_rps']:>6.0f} requests/s "
            f"(load generator CPU {c['generator_cpu']:.2f} cores at that step)"
        )
    for name, value in cap["ratios"].items():
        print(f"  {name}: {value:.2f}")
    share = cap["ratios"].get("read/trivial ASGI")
    if share is None:
        return {}
    return {f"read capacity >= {CAPACITY_SHARE_TARGET} x trivial": share >= CAPACITY_SHARE_TARGET}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _row(name: str, values: list[float], errors: int, wall: float) -> dict[str, Any]:
    return {
        "route": name,
        "requests": len(values),
        "rps": len(values) / wall,
        "p50_ms": _pct(values, 0.50),
        "p99_ms": _pct(values, 0.99),
        "max_ms": max(values) if values else float("nan"),
        "errors": errors,
    }


def report(
    plan: Plan,
    rec: Recorder,
    cpu: dict[str, Any],
    pg: PgSampler,
    after_load: int,
    budget: tuple[int | None, str],
    logs: dict[str, dict[str, Any]],
    cap: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], bool]:
    wall = cpu["wall"]
    errors_by_route: Counter[str] = Counter()
    for key, n in rec.errors.items():
        errors_by_route[key.rsplit(" ", 1)[0] if key.count(":") else key] += n
    rows = [
        _row(route, values, errors_by_route[route], wall)
        for route, values in sorted(rec.latency.items())
    ]
    groups = []
    for group in GROUPS:
        values = [v for route, vs in rec.latency.items() if route.startswith(group) for v in vs]
        errs = sum(n for route, n in errors_by_route.items() if route.startswith(group))
        if values:
            groups.append(_row(group, values, errs, wall))
    http = [v for route, vs in rec.latency.items() if not route.startswith("ws") for v in vs]
    total = _row("all HTTP", http, sum(g["errors"] for g in groups if g["route"] != "ws"), wall)

    print(f"\nmeasured {wall:.0f} s after {plan.warmup:.0f} s of warm-up")
    print(
        f"{'route':<18} {'requests':>8} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6}"
    )
    for r in [*rows, None, *groups, total]:
        if r is None:
            print("-" * 70)
            continue
        print(
            f"{r['route']:<18} {r['requests']:>8} {r['rps']:>7.1f} {r['p50_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} {r['errors']:>6}"
        )
    errors = sum(rec.errors.values())
    print(
        "errors:",
        ", ".join(f"{k}: {n}" for k, n in sorted(rec.errors.items())) if errors else "none",
    )
    tel_p50, tel_p99 = _pct(rec.intervals, 0.5), _pct(rec.intervals, 0.99)
    print(
        f"telemetry: {plan.sockets} sockets, {rec.samples} samples, interval p50 {tel_p50:.2f} s, "
        f"p99 {tel_p99:.2f} s, longest gap {rec.max_gap:.2f} s; {rec.silent_sockets} sockets got "
        f"nothing, {rec.reconnects} reconnects"
    )
    if rec.retried:
        print(f"{rec.retried} GETs sent again after the server closed their kept-alive connection")
    if rec.slow:
        slowest = ", ".join(f"{t} s: {n}" for t, n in sorted(rec.slow.most_common(8)))
        print(
            f"requests over {API_P99_TARGET_MS:.0f} ms: {sum(rec.slow.values())} in "
            f"{len(rec.slow)} of the {int(rec.end - rec.start)} seconds; the most at "
            f"(second of the window: requests) {slowest}; orders placed at seconds "
            f"{', '.join(map(str, rec.order_seconds)) or 'none'}"
        )
    print("orders:", ", ".join(f"{k} {n}" for k, n in rec.orders.items()) or "none")
    peak, peak_active, server_peak = pg.peak(rec.start, rec.end)
    overall = pg.peak(0, math.inf)[0]
    limit, source = budget
    print(
        f"PostgreSQL: peak {peak} connections ({peak_active} not idle) during the measurement, "
        f"{overall} over the whole run, {after_load} {plan.settle:.0f} s after the load; "
        f"the server's clients peaked at {server_peak} of max_connections {pg.max_connections}"
        + (f" ({pg.failures} s it could not be sampled)" if pg.failures else "")
        + "; budget "
        + (f"{limit} ({source})" if limit is not None else f"not documented ({source})")
    )
    stack_cpu = cpu["stack"]
    print(
        "CPU in cores (CPU s / wall s): load generator "
        f"{cpu['generator']:.2f}, "
        + ", ".join(f"{k} {v:.2f}" for k, v in stack_cpu.items())
        + f"; web {_per_request_ms(stack_cpu.get('web', 0.0), total):.1f} ms of CPU per HTTP "
        f"request; the machine {cpu['machine']:.2f} of {os.cpu_count()} cores busy "
        f"(PostgreSQL and other work included), load average {os.getloadavg()[0]:.1f}"
    )
    for name, found in logs.items():
        print(f"{name} log: {found['tracebacks']} tracebacks; " + "; ".join(found["commonest"]))

    api = next((g for g in groups if g["route"] == "api"), _row("api", [], 0, wall))
    rate_target = API_RATE_SHARE * plan.api_clients / plan.api_interval
    targets = {
        "no errors": errors == 0,
        f"API p99 < {API_P99_TARGET_MS:.0f} ms": api["p99_ms"] < API_P99_TARGET_MS,
        f"API >= {rate_target:.0f} requests/s": api["rps"] >= rate_target,
        f"telemetry interval p99 < {TELEMETRY_P99_TARGET_S} s": tel_p99 < TELEMETRY_P99_TARGET_S
        and rec.silent_sockets == 0,
    }
    if limit is not None:
        targets[f"connections <= budget {limit}"] = overall <= limit
    if cap is not None:
        targets.update(report_capacity(cap))
    print(
        "targets: "
        + "; ".join(f"{name}: {'ok' if ok else 'MISSED'}" for name, ok in targets.items())
        + ("" if limit is not None else "; connection budget: not documented, peak shown only")
    )
    ok = all(targets.values())
    print("verdict:", "meets the targets" if ok else "MISSES a target")
    summary = {
        "plan": asdict(plan),
        "seconds": wall,
        "requests": total["requests"],
        "rps": total["rps"],
        "routes": rows,
        "groups": groups,
        "errors": dict(rec.errors),
        "retried_gets": rec.retried,
        "telemetry": {
            "sockets": plan.sockets,
            "samples": rec.samples,
            "interval_p50_s": tel_p50,
            "interval_p99_s": tel_p99,
            "max_gap_s": rec.max_gap,
            "silent_sockets": rec.silent_sockets,
            "reconnects": rec.reconnects,
        },
        "orders": dict(rec.orders),
        "postgres": {
            "peak_connections": peak,
            "peak_not_idle": peak_active,
            "peak_whole_run": overall,
            "after_load": after_load,
            "max_connections": pg.max_connections,
            "server_peak": server_peak,
            "unsampled_seconds": pg.failures,
            "budget": limit,
            "budget_source": source,
        },
        "cpu_cores": {"generator": cpu["generator"], **stack_cpu, "machine": cpu["machine"]},
        "web_cpu_ms_per_request": _per_request_ms(stack_cpu.get("web", 0.0), total),
        "server_log_tracebacks": logs,
        "capacity": cap,
        "targets": targets,
        "ok": ok,
    }
    print("summary: " + json.dumps(_finite(summary), allow_nan=False))
    return summary, ok


def report_capacity_only(
    plan: Plan, cap: dict[str, Any], logs: dict[str, dict[str, Any]], gone: list[str]
) -> tuple[dict[str, Any], bool]:
    """``--capacity-only``: the curves' figures, their targets and the summary line."""
    for name, found in logs.items():
        print(f"{name} log: {found['tracebacks']} tracebacks; " + "; ".join(found["commonest"]))
    targets = report_capacity(cap)
    if gone:
        targets["no stack process exited"] = False
        print(f"stack: {', '.join(gone)} exited")
    print("targets: " + "; ".join(f"{n}: {'ok' if ok else 'MISSED'}" for n, ok in targets.items()))
    ok = all(targets.values())
    print("verdict:", "meets the targets" if ok else "MISSES a target")
    summary = {
        "plan": asdict(plan),
        "capacity": cap,
        "server_log_tracebacks": logs,
        "targets": targets,
        "ok": ok,
    }
    print("summary: " + json.dumps(_finite(summary), allow_nan=False))
    return summary, ok


def _per_request_ms(cores: float, total: dict[str, Any]) -> float:
    """The web processes' CPU per HTTP request served (websockets and the relay's pushes
    included in the CPU, so an upper bound)."""
    return cores * 1000 / total["rps"] if total["rps"] else float("nan")


def _finite(value: Any) -> Any:
    """``value`` with NaN (a route without requests) as null, so the line is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*)$", re.M)


def _tracebacks(prod: ProductionStack) -> dict[str, dict[str, Any]]:
    """Per process: how many tracebacks its log holds and its three commonest exception lines."""
    out: dict[str, dict[str, Any]] = {}
    for proc in prod.stack.procs:
        text = proc.log.read_text(errors="replace")
        count = text.count("Traceback (most recent call last)")
        if count:
            common = Counter(m[:160] for m in EXCEPTION_LINE.findall(text)).most_common(3)
            out[proc.name] = {"tracebacks": count, "commonest": [f"{n}x {m}" for m, n in common]}
    return out


def _run(coro: Any) -> Any:
    """On uvloop where installed (uvicorn's extra brings it): less of the generator's CPU."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _check_services() -> None:
    """PostgreSQL and redis-server are needed: say so plainly when they are not there."""
    import psycopg

    from bench.support.production import DEFAULT_SERVER_URL

    server = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    if shutil.which("redis-server") is None:
        raise SystemExit("bench/load.py needs redis-server (Debian: apt-get install redis-server)")
    try:  # the server's own database: the bench's is created next to it
        admin = urlunsplit(urlsplit(server)._replace(path="/postgres"))
        psycopg.connect(admin, connect_timeout=5).close()
    except psycopg.Error as exc:
        raise SystemExit(
            f"bench/load.py needs PostgreSQL (DATABASE_URL, else {DEFAULT_SERVER_URL}), where it "
            f"creates and drops a database of its own: {exc}"
        ) from None


def bench(plan: Plan, budget_override: int | None, quick: bool, keep: bool = False) -> int:
    _check_services()
    work = Path(tempfile.mkdtemp(prefix="bench-load-"))
    try:
        t0 = time.monotonic()
        with production_stack(work, SIM_TIME_SCALE=str(plan.sim_time_scale)) as prod:
            t1 = time.monotonic()
            prod.start_processes()  # they import Django while the data is made
            data = _setup(prod, plan)
            t2 = time.monotonic()
            prod.wait_ready()
            if plan.through_edge:
                servers.wait_healthy(f"http://{prod.env['EDGE_LISTEN']}", timeout=60)
            ids = [c["instance"] for c in data["customers"]]
            _wait_running(prod, ids, timeout=300)
            budget = (
                (budget_override, "--budget")
                if budget_override is not None
                else connection_budget(data["db"], prod.env)
            )
            print(
                f"set-up ({time.monotonic() - t0:.0f} s, not measured: database and static files "
                f"{t1 - t0:.0f} s, users {t2 - t1:.0f} s, processes ready and instances running "
                f"{time.monotonic() - t2:.0f} s): PostgreSQL database {prod.database_name}, "
                f"redis-server {prod.redis_url}, Procfile processes "
                f"{', '.join(p.name for p in prod.stack.procs)} on {prod.url}"
                f"{' (the clients through the edge, nginx at ' + prod.env['EDGE_LISTEN'] + ')' if plan.through_edge else ''}; "
                f"{plan.customers} customers, each with a running 1-card host"
            )
            print(
                ("" if plan.mixed else "(not run: --capacity-only) ")
                + f"load: {plan.api_clients} API clients (a poll every {plan.api_interval:g} s each), "
                f"{plan.sockets} telemetry websockets, {plan.browsers} browser sessions (a page "
                f"every {plan.think[0]:g}-{plan.think[1]:g} s), {plan.orders_per_minute:g} orders "
                f"and releases a minute; {plan.duration:.0f} s measured"
            )
            sys.stdout.flush()
            if plan.mixed:
                pg = PgSampler(prod.database_url)
                pg.start()
                rec = Recorder()
                cpu = _run(drive(prod, data, plan, rec))
                time.sleep(plan.settle)
                pg.stop.set()
                pg.join(timeout=10)
                after_load = pg.samples[-1][1] if pg.samples else 0
            # The curves after the mixed load, on the same stack (its background work goes on).
            cap = run_capacity(prod, data, plan, work) if plan.capacity else None
            gone = prod.exited()
            if not plan.mixed:
                assert cap is not None
                _, ok = report_capacity_only(plan, cap, _tracebacks(prod), gone)
            else:
                if gone:
                    rec.errors[f"stack: {', '.join(gone)} exited"] += 1
                _, ok = report(plan, rec, cpu, pg, after_load, budget, _tracebacks(prod), cap)
    finally:
        if keep:
            print(f"the processes' logs are kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok or quick else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = Plan()
    parser.add_argument("--duration", type=float, help="measured seconds (300; --quick: 30)")
    parser.add_argument("--api-clients", type=int, help=f"({defaults.api_clients})")
    parser.add_argument(
        "--api-interval", type=float, help=f"s between polls ({defaults.api_interval})"
    )
    parser.add_argument("--sockets", type=int, help=f"telemetry websockets ({defaults.sockets})")
    parser.add_argument("--browsers", type=int, help=f"browser sessions ({defaults.browsers})")
    parser.add_argument("--orders-per-minute", type=float, help=f"({defaults.orders_per_minute:g})")
    parser.add_argument(
        "--warmup", type=float, help=f"s of load before measuring ({defaults.warmup:g})"
    )
    parser.add_argument("--budget", type=int, help="the connection budget, if not in the settings")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (process logs)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a 30 s smoke run: 20 API clients, 10 sockets, 5 browsers (no exit status on targets)",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="every client straight to the web processes (default: through the Procfile's edge)",
    )
    parser.add_argument("--edge", action="store_true", help="through the edge (the default)")
    parser.add_argument(
        "--capacity-only",
        action="store_true",
        help="only the capacity curves (instance read, trivial answer), not the mixed load",
    )
    parser.add_argument("--no-capacity", action="store_true", help="no capacity curves")
    parser.add_argument(
        "--step-seconds",
        type=float,
        help=f"seconds per offered rate of the curves ({defaults.step_seconds:g}; --quick: "
        f"{QUICK.step_seconds:g})",
    )
    parser.add_argument(
        "--rates",
        type=float,
        nargs=3,
        metavar=("FROM", "UP_TO", "FACTOR"),
        help=f"the curves' offered rates ({' '.join(f'{r:g}' for r in defaults.rates)})",
    )
    parser.add_argument(
        "--wsgi",
        action="store_true",
        help="the curves also against the API served by WSGI (console.wsgi) beside the ASGI web",
    )
    args = parser.parse_args()
    if args.direct and args.edge:
        parser.error("--direct or --edge, not both")
    if args.capacity_only and args.no_capacity:
        parser.error("--capacity-only or --no-capacity, not both")
    plan = replace(QUICK) if args.quick else Plan()
    plan.through_edge = not args.direct
    plan.mixed = not args.capacity_only
    plan.capacity = not args.no_capacity
    plan.wsgi = args.wsgi
    if args.step_seconds is not None:
        if args.step_seconds <= 0:
            parser.error("--step-seconds must be positive")
        plan.step_seconds = args.step_seconds
    if args.rates is not None:
        start, stop, factor = args.rates
        plan.rates = (start, stop, factor)
    for name in ("duration", "api_clients", "api_interval", "sockets", "browsers", "warmup"):
        if getattr(args, name) is not None:
            setattr(plan, name, getattr(args, name))
    if args.orders_per_minute is not None:
        plan.orders_per_minute = args.orders_per_minute
    return bench(plan, args.budget, args.quick, args.keep)


if __name__ == "__main__":
    sys.exit(main())
