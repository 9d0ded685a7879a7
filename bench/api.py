"""API polling benchmark (issue 22, "How much it holds"): the three routes bench/load.py's API
clients poll (their instance list, their wallet, their instance), with tokens, through one uvicorn
process on PostgreSQL, against a trivial token-authenticated route on the same server.

    .venv/bin/python bench/api.py                        # 3 rounds of 10 s per route
    .venv/bin/python bench/api.py --quick                # 1 round of 3 s (the test's)
    .venv/bin/python bench/api.py --baseline-tree DIR    # also a server from another checkout

The stack (bench/support/production.py): a fresh PostgreSQL database next to ``DATABASE_URL``'s
(or 127.0.0.1:5432), a private redis-server, the Procfile's worker to provision the set-up
instances (``SIM_TIME_SCALE=0.02``), and the Procfile's web line with ``WEB_CONCURRENCY=1``: one
uvicorn process with the connection pool the settings give it. Set-up is not measured: 10
customers (bench/load.py's set-up), each with two API tokens and a running 1-card host.

Measured: ``--clients`` closed-loop clients (each with its own token and connection; a request
as soon as the last one answered), one route at a time, in rounds over the routes (so the
machine's other work falls on every route alike). Per route: requests/s, p50/p99 in ms, the
web process's CPU per request (its utime + stime over the route's requests: the figure least
moved by what else the machine is doing) and the database's (the PostgreSQL backends serving
the bench's database, read from /proc: a server on this machine only, else NaN). The baseline is ``GET /api/v1/ssh-keys/`` (token
check, middleware, DRF, one empty list): what any API request costs at least. With
``--baseline-tree DIR`` a second web process runs DIR's code (another checkout of this project,
e.g. ``git archive HEAD | tar -x -C DIR`` and ``ln -s $PWD/.venv DIR/.venv``) on the same
database, and the rounds alternate between the two servers: the before and after of a change in
one run (the database is migrated by this tree: DIR's models must read it).

Exit status 0 unless a request answered other than 200 or the set-up failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The checkout on the path and the script's own folder off it (bench/queue.py would shadow
# the standard library's queue for everything imported after).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p).resolve() != ROOT / "bench")]

from bench.load import Plan, _check_services, _run, _setup, _wait_running  # noqa: E402
from bench.support.production import (  # noqa: E402
    ProductionStack,
    database_cpu_seconds,
    procfile,
    production_stack,
    tree_cpu_seconds,
)
from tests.support import servers  # noqa: E402

BASELINE = "baseline: ssh-keys"
CUSTOMERS = 10
TOKENS = 2


@dataclass
class Server:
    label: str
    url: str
    pid: int
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    db_cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _routes(instance: str) -> list[tuple[str, str]]:
    return [
        (BASELINE, "/api/v1/ssh-keys/"),
        ("instances", "/api/v1/instances/"),
        ("wallet", "/api/v1/billing/wallet/"),
        ("instance", f"/api/v1/instances/{instance}/"),
    ]


def _start_web(prod: ProductionStack, name: str, tree: Path) -> Server:
    """The Procfile's web line, one uvicorn process, run from ``tree`` (its code) on a free port."""
    port = servers.free_port()
    command = procfile()["web"]
    env = f"export PORT={port} WEB_PORT={port} WEB_CONCURRENCY=1;"
    proc = prod.stack.spawn(
        name, "/bin/sh", "-c", f"cd {shlex.quote(str(tree))} && {env} exec {command}"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        servers.wait_healthy(url, timeout=180, alive=lambda: proc.popen.poll() is None)
    except RuntimeError as exc:
        raise SystemExit(f"{exc}:\n{proc.output()}") from None
    return Server(name, url, proc.popen.pid)


async def _round(
    server: Server,
    route: str,
    paths: list[tuple[str, str]],
    seconds: float,
    warmup: float,
    database_url: str,
) -> None:
    """``len(paths)`` clients (token, path) asking one route as fast as it answers."""
    import httpx

    start = time.monotonic() + warmup
    end = start + seconds

    async def client(token: str, path: str) -> None:
        async with httpx.AsyncClient(
            base_url=server.url,
            headers={"Authorization": f"Token {token}"},
            timeout=60,
            trust_env=False,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        ) as http:
            while (t0 := time.monotonic()) < end:
                response = await http.get(path)
                if t0 >= start:
                    server.latency[route].append((time.monotonic() - t0) * 1000)
                    if response.status_code != 200:
                        server.errors[route] += 1

    async def measure() -> None:
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        cpu = tree_cpu_seconds(server.pid)
        db_cpu = await asyncio.to_thread(database_cpu_seconds, database_url)
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        server.cpu[route] += tree_cpu_seconds(server.pid) - cpu
        server.db_cpu[route] += await asyncio.to_thread(database_cpu_seconds, database_url) - db_cpu

    await asyncio.gather(measure(), *(client(token, path) for token, path in paths))
    server.seconds[route] += seconds


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else math.nan


def _rows(server: Server, routes: list[str]) -> list[dict[str, Any]]:
    rows = []
    for route in routes:
        values = server.latency[route]
        n = len(values)
        rows.append(
            {
                "server": server.label,
                "route": route,
                "requests": n,
                "rps": n / server.seconds[route] if server.seconds[route] else math.nan,
                "p50_ms": _pct(values, 0.5),
                "p99_ms": _pct(values, 0.99),
                "cpu_ms": server.cpu[route] * 1000 / n if n else math.nan,
                "db_cpu_ms": server.db_cpu[route] * 1000 / n if n else math.nan,
                "errors": server.errors[route],
            }
        )
    return rows


def bench(args: argparse.Namespace) -> int:
    _check_services()
    work = Path(tempfile.mkdtemp(prefix="bench-api-"))
    plan = Plan(api_clients=CUSTOMERS * TOKENS, browsers=CUSTOMERS)
    try:
        with production_stack(work, SIM_TIME_SCALE="0.02") as prod:
            worker = procfile()["worker"]
            helper = prod.stack.spawn("worker", "/bin/sh", "-c", worker)
            data = _setup(prod, plan)
            customers = data["customers"]
            _wait_running(prod, [c["instance"] for c in customers], timeout=300)
            # The worker is done with the set-up: stopped, so only the web works while measured.
            os.killpg(helper.popen.pid, signal.SIGTERM)
            helper.popen.wait(timeout=60)
            prod.stack.procs.remove(helper)
            targets = [_start_web(prod, "this tree", ROOT)]
            if args.baseline_tree:
                targets.insert(0, _start_web(prod, "baseline tree", Path(args.baseline_tree)))
            # One client per token, up to --clients, each polling its own customer's instance.
            pairs = [(c, t) for t in range(TOKENS) for c in customers][: args.clients]
            route_names = [name for name, _ in _routes("")]
            print(
                f"one uvicorn process per tree ({', '.join(s.label for s in targets)}), PostgreSQL "
                f"database {prod.database_name}; {len(pairs)} closed-loop clients, {args.rounds} "
                f"round(s) of {args.seconds:g} s per route after {args.warmup:g} s of warm-up; "
                f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start"
            )
            sys.stdout.flush()
            for _ in range(args.rounds):
                for index, route in enumerate(route_names):
                    for server in targets:
                        paths = [
                            (c["tokens"][t], _routes(c["instance"])[index][1]) for c, t in pairs
                        ]
                        _run(
                            _round(
                                server, route, paths, args.seconds, args.warmup, prod.database_url
                            )
                        )
            gone = prod.exited()
            rows = [row for server in targets for row in _rows(server, route_names)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report(rows, gone)


def report(rows: list[dict[str, Any]], gone: list[str]) -> int:
    print(
        f"\n{'server':<14} {'route':<20} {'requests':>8} {'req/s':>7} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'CPU ms/req':>10} {'DB CPU ms/req':>13} {'errors':>6}"
    )
    for r in rows:
        print(
            f"{r['server']:<14} {r['route']:<20} {r['requests']:>8} {r['rps']:>7.1f} "
            f"{r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['cpu_ms']:>10.2f} "
            f"{r['db_cpu_ms']:>13.2f} {r['errors']:>6}"
        )
    by = {(r["server"], r["route"]): r for r in rows}
    if any(server == "baseline tree" for server, _ in by):
        print(
            "\nthis tree against the baseline tree (web and database CPU per request, requests/s):"
        )
        for (server, route), r in by.items():
            if server != "this tree":
                continue
            before = by[("baseline tree", route)]
            print(
                f"   {route:<20} CPU {before['cpu_ms']:.2f} -> {r['cpu_ms']:.2f} ms "
                f"({r['cpu_ms'] / before['cpu_ms']:.2f}x), database {before['db_cpu_ms']:.2f} -> "
                f"{r['db_cpu_ms']:.2f} ms, {before['rps']:.0f} -> {r['rps']:.0f} req/s"
            )
    errors = sum(r["errors"] for r in rows)
    print(f"errors: {errors}" + (f"; exited: {', '.join(gone)}" if gone else ""))
    clean = [{k: (None if v != v else v) for k, v in r.items()} for r in rows]  # NaN -> null
    print("summary: " + json.dumps({"rows": clean, "errors": errors, "exited": gone}))
    return 0 if errors == 0 and not gone else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20, help="closed-loop clients (20)")
    parser.add_argument("--seconds", type=float, help="measured seconds per route and round (10)")
    parser.add_argument("--rounds", type=int, help="rounds over the routes (3)")
    parser.add_argument("--warmup", type=float, help="s of requests before each measurement (1)")
    parser.add_argument("--baseline-tree", help="another checkout to serve and compare against")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s: a smoke run")
    args = parser.parse_args()
    quick = {"seconds": 3.0, "rounds": 1, "warmup": 0.5}
    full = {"seconds": 10.0, "rounds": 3, "warmup": 1.0}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
