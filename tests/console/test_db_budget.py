"""Production's database connection budget, and 503s (never 500s) when the database falters.

Real processes on the machine's PostgreSQL: two uvicorn web processes (``--workers 2``, as the
Procfile starts them) with the pool. 24 API clients with their own tokens poll the instance list
and the wallet for 12 s: no answer is a 5xx, and the database's connections (sampled from
``pg_stat_activity`` every 50 ms) never exceed the web's share of the README's budget,
WEB_CONCURRENCY × DB_POOL_MAX_SIZE. Before the pool (DB_CONN_MAX_AGE=60 kept a connection per
request thread under ASGI) the same load took dozens of connections.

Faults: a web process whose only pooled connection is blocked (a table lock) answers the next API
request and page with 503 + ``Retry-After`` after DB_POOL_TIMEOUT; the blocked request, its
backend terminated with ``pg_terminate_backend``, answers 503 too; then the pool replaces the
dead connection and the same requests succeed.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from tests.support import servers

pytestmark = pytest.mark.integration

CLIENTS = 24
LOAD_SECONDS = 12.0
WARM_UP_SECONDS = 3.0
ROUTES = ("/api/v1/instances/", "/api/v1/billing/wallet/")

USERS_AND_TOKENS = """
from console import services
from console.models import User
for i in range({n}):
    u = User.objects.create(username=f"load{{i}}", email=f"load{{i}}@example.com")
    print(services.create_api_token(u, name="load")[1])
"""


@dataclass
class Database:
    url: str
    tokens: list[str]
    static_root: str


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One migrated database for the module, with CLIENTS customers and their tokens, and the
    collected static files (the 503 page links them through the manifest)."""
    url = servers.create_postgres_database(os.environ["DATABASE_URL"])
    static_root = str(tmp_path_factory.mktemp("static"))
    try:
        env = servers.production_env(url, os.environ["REDIS_URL"])
        env["STATIC_ROOT"] = static_root
        with ThreadPoolExecutor(max_workers=1) as pool:  # collect while migrating
            collected = pool.submit(servers.manage, env, "collectstatic", "--noinput", "-v", "0")
            servers.manage(env, "migrate", "--noinput", "-v", "0")
            out = servers.manage(env, "shell", "-c", USERS_AND_TOKENS.format(n=CLIENTS))
            collected.result()
        tokens = [line for line in out.split() if line.startswith("gct_")]
        assert len(tokens) == CLIENTS, out
        yield Database(url, tokens, static_root)
    finally:
        servers.drop_postgres_database(url)


def _stack(database: Database, tmp_path: Path, **env: str) -> servers.Stack:
    environ = servers.production_env(database.url, os.environ["REDIS_URL"])
    environ.update(STATIC_ROOT=database.static_root, **env)
    return servers.Stack(env=environ, port=servers.free_port(), tmp=tmp_path)


def _start_web(stack: servers.Stack, workers: int) -> None:
    """uvicorn as the Procfile runs it: ``workers`` processes on one port."""
    stack.spawn(
        "web",
        str(servers.BIN / "uvicorn"),
        "console.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(stack.port),
        "--lifespan",
        "off",
        "--workers",
        str(workers),
        "--log-level",
        "warning",
    )
    stack.wait_healthy(timeout=120)


def _admin_url(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/postgres"))


class ConnectionSampler:
    """The database's connections, counted from another database every 50 ms (the sampler's
    own connection is not one of them)."""

    def __init__(self, url: str) -> None:
        self.name = urlsplit(url).path.lstrip("/")
        self.admin = _admin_url(url)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self, conn: psycopg.Connection) -> int:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.name,)
        ).fetchone()
        return int(row[0]) if row else 0

    def _run(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            while not self._stop.is_set():
                self.peak = max(self.peak, self.count(conn))
                self._stop.wait(0.05)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class LoadResult:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) * 1000 if lat else 0.0
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else 0.0
        rate = len(lat) / self.seconds if self.seconds else 0.0
        return (
            f"{len(lat)} requests in {self.seconds:.1f} s ({rate:.1f}/s), "
            f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, statuses {dict(sorted(self.statuses.items()))}"
        )


async def _client(base: str, token: str, until: float, result: LoadResult, n: int) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
        i = n
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                response = await client.get(ROUTES[i % len(ROUTES)])
            except httpx.HTTPError as exc:
                result.errors.append(repr(exc))
                continue
            result.latencies.append(time.monotonic() - started)
            result.statuses[response.status_code] = result.statuses.get(response.status_code, 0) + 1
            i += 1


async def _load(base: str, tokens: list[str], seconds: float) -> LoadResult:
    result = LoadResult()
    started = time.monotonic()
    until = started + seconds
    await asyncio.gather(*(_client(base, t, until, result, n) for n, t in enumerate(tokens)))
    result.seconds = time.monotonic() - started
    return result


def run_load(stack: servers.Stack, tokens: list[str], seconds: float) -> tuple[LoadResult, int]:
    """``tokens`` clients polling for ``seconds`` after a warm-up (each process's first requests
    import the API's modules and open the pool); the measured part and the peak connections of
    the whole run, warm-up included."""
    with ConnectionSampler(stack.env["DATABASE_URL"]) as sampler:
        warm = servers.run_async(_load(stack.url, tokens, WARM_UP_SECONDS))
        result = servers.run_async(_load(stack.url, tokens, seconds))
    result.errors += warm.errors
    for code, count in warm.statuses.items():
        if code != 200:
            result.statuses[code] = result.statuses.get(code, 0) + count
    return result, sampler.peak


def test_api_load_stays_within_the_connection_budget(database: Database, tmp_path: Path) -> None:
    """The web processes' share: WEB_CONCURRENCY × DB_POOL_MAX_SIZE, whatever the load. (The
    worker's and the relay's rows of the budget hold by construction: one thread each runs
    queries; the production bench, bench/load.py, reports the whole stack's peak.)"""
    web, pool_max = 2, 4
    # A starved CI machine must not turn a slow wait into a 503 here (the 503 is tested below).
    stack = _stack(
        database,
        tmp_path,
        DB_POOL_MAX_SIZE=str(pool_max),
        DB_POOL_MIN_SIZE="1",
        DB_POOL_TIMEOUT="30",
    )
    try:
        _start_web(stack, workers=web)
        result, peak = run_load(stack, database.tokens, LOAD_SECONDS)
        print(f"\npool (2 web × max {pool_max}): {result.summary()}; peak connections {peak}")
        assert not result.errors, result.errors[:5]
        assert set(result.statuses) == {200}, (result.statuses, stack.logs())
        assert peak <= web * pool_max, f"{peak} connections, over the budget of {web * pool_max}"
        assert len(result.latencies) > CLIENTS  # every client got answers
    finally:
        stack.stop()


def _blocked_backends(admin: str, name: str) -> list[int]:
    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
            (name,),
        ).fetchall()
    return [r[0] for r in rows]


def _assert_503(response: httpx.Response, *, api: bool, stack: servers.Stack) -> None:
    assert response.status_code == 503, (response.text[:300], stack.logs())
    assert response.headers["Retry-After"] == "5"
    if api:
        assert response.json()["error"] == "unavailable"
        assert response.json()["retry_after"] == 5


def test_exhausted_pool_and_terminated_backend_answer_503(
    database: Database, tmp_path: Path
) -> None:
    stack = _stack(
        database, tmp_path, DB_POOL_MAX_SIZE="1", DB_POOL_MIN_SIZE="1", DB_POOL_TIMEOUT="1"
    )
    admin = _admin_url(database.url)
    name = urlsplit(database.url).path.lstrip("/")
    headers = {"Authorization": f"Bearer {database.tokens[0]}", "Accept-Language": "en"}
    try:
        _start_web(stack, workers=1)
        with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as client:
            assert client.get("/api/v1/instances/").status_code == 200
            with (
                psycopg.connect(database.url) as locker,
                ThreadPoolExecutor(max_workers=1) as pool,
            ):
                # The table lock blocks every token check: the first request holds the web
                # process's only connection, waiting.
                locker.execute("LOCK TABLE console_apitoken IN ACCESS EXCLUSIVE MODE")
                blocked = pool.submit(client.get, "/api/v1/billing/wallet/")
                deadline = time.monotonic() + 20
                while not (pids := _blocked_backends(admin, name)):
                    assert time.monotonic() < deadline, "the request never reached the lock"
                    time.sleep(0.1)
                # The pool is exhausted: after DB_POOL_TIMEOUT, 503 for an API call and a page.
                _assert_503(client.get("/api/v1/instances/"), api=True, stack=stack)
                page = httpx.get(f"{stack.url}/", timeout=30)
                _assert_503(page, api=False, stack=stack)
                assert "503" in page.text
                # The blocked request's backend is terminated: that request answers 503 too.
                with psycopg.connect(admin, autocommit=True) as conn:
                    for pid in pids:
                        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                _assert_503(blocked.result(timeout=30), api=True, stack=stack)
                locker.rollback()
            # The pool replaced the dead connection: the same requests succeed again.
            assert client.get("/api/v1/instances/").status_code == 200
            assert httpx.get(f"{stack.url}/", timeout=30).status_code == 200
        assert "Internal Server Error" not in stack.procs[0].output()
    finally:
        stack.stop()
