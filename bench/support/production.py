"""The production stack as ``make prod`` runs it, for the benchmarks that need real processes: a
fresh PostgreSQL database, a private redis-server, ``collectstatic`` into the run's own folder,
then every line of the Procfile (web: uvicorn with its workers, the Celery worker, beat, the
telemetry relay) started through a shell as honcho starts it, so the bench follows the Procfile
and the settings (``WEB_CONCURRENCY``, ``CELERY_CONCURRENCY``, ``DB_*``...) the environment gives.

Each process gets its own log under the work folder and its own process group, so stopping it
also stops the workers it forked, and its CPU time is summed over its descendants."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tests.support import servers

ROOT = Path(__file__).resolve().parents[2]
PROCFILE = ROOT / "Procfile"
TICK = os.sysconf("SC_CLK_TCK")
DEFAULT_SERVER_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def procfile(path: Path = PROCFILE) -> dict[str, str]:
    """The Procfile's process types and commands, in file order."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() and not line.lstrip().startswith("#"):
            out[name.strip()] = command.strip()
    return out


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _cpu(pid: int) -> float:
    """utime + stime of one live process, in seconds (0 once it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant (uvicorn's and Celery's workers)."""
    tree = _children()
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += _cpu(current)
        todo.extend(tree.get(current, []))
    return total


def database_cpu_seconds(database_url: str) -> float:
    """CPU seconds of the PostgreSQL backends serving ``database_url``'s database now (this machine's
    server only: NaN when its processes cannot be read here). Backends the pools keep open live
    through a measurement, so the difference of two readings is what serving it cost the server."""
    import psycopg

    parts = urlsplit(database_url)
    if parts.hostname not in (None, "", "127.0.0.1", "localhost", "::1"):
        return math.nan
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            own = conn.info.backend_pid
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                (parts.path.lstrip("/"), own),
            ).fetchall()
    except psycopg.Error:
        return math.nan
    pids = [int(row[0]) for row in rows]
    if pids and not Path(f"/proc/{pids[0]}").exists():
        return math.nan
    return sum(_cpu(pid) for pid in pids)


def machine_busy_seconds() -> float:
    """CPU seconds all cores of this machine spent not idle (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / TICK


@dataclass
class ProductionStack:
    env: dict[str, str]
    database_url: str
    redis_url: str
    stack: servers.Stack
    redis_proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return self.stack.url

    @property
    def database_name(self) -> str:
        return self.database_url.rsplit("/", 1)[1]

    def manage(self, *args: str, **env: str) -> str:
        return servers.manage({**self.env, **env}, *args)

    def start_processes(self) -> None:
        """Every Procfile line, through ``/bin/sh -c`` as honcho runs it (``wait_ready`` waits)."""
        for name, command in procfile().items():
            self.stack.spawn(name, "/bin/sh", "-c", command)  # as honcho: shell=True

    def wait_ready(self, timeout: float = 180) -> None:
        """Until the web answers /healthz and the worker is ready. A loaded machine may take long
        to import Django in every process."""
        self.stack.wait_healthy(timeout=timeout)
        worker = next(p for p in self.stack.procs if p.name == "worker")
        deadline = time.monotonic() + timeout
        while " ready." not in worker.log.read_text(errors="replace"):  # output() is the tail
            if time.monotonic() > deadline or worker.popen.poll() is not None:
                raise RuntimeError(f"the worker did not become ready:\n{self.stack.logs()}")
            time.sleep(0.3)

    def exited(self) -> list[str]:
        """The processes that are no longer running."""
        return [p.name for p in self.stack.procs if p.popen.poll() is not None]

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds per Procfile process (with its workers) and for redis-server."""
        out = {p.name: tree_cpu_seconds(p.popen.pid) for p in self.stack.procs}
        out["redis"] = tree_cpu_seconds(self.redis_proc.pid)
        return out

    def stop(self) -> None:
        """SIGTERM to every process group (workers included), SIGKILL what is left after 20 s."""
        for proc in self.stack.procs:
            _signal_group(proc.popen, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.stack.procs:
            with suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            _signal_group(proc.popen, signal.SIGKILL)
            proc.popen.wait(timeout=10)


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(popen.pid, sig)  # spawned with start_new_session: its own group


@contextmanager
def production_stack(
    work: Path, server_url: str | None = None, **extra_env: str
) -> Iterator[ProductionStack]:
    """A migrated database with the demo data (fleet, catalogue), a private Redis and collected
    static files; the processes are not started yet (``start_processes``) so the caller can add
    its data first. Everything is stopped and the database dropped on exit."""
    database_url = servers.create_postgres_database(
        server_url or os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    )
    redis_proc, redis_url = servers.start_redis(work)
    env = servers.production_env(database_url, redis_url)
    port = servers.free_port()
    env.update(
        HOST="127.0.0.1",
        PORT=str(port),
        WEB_PORT=str(port),  # the Procfile's web (behind its edge, issue 34)
        # The Procfile's edge (nginx, issue 34) on a port of this run's own, its files here.
        EDGE_LISTEN=f"127.0.0.1:{servers.free_port()}",
        EDGE_DIR=str(work / "edge"),
        STATIC_ROOT=str(work / "static"),
        CELERY_BEAT_SCHEDULE_FILE=str(work / "celerybeat-schedule"),
        STATE_DIR=str(work / "state"),
        **extra_env,
    )
    stack = servers.Stack(env=env, port=port, tmp=work)
    prod = ProductionStack(env, database_url, redis_url, stack, redis_proc)
    try:
        # collectstatic needs no database: it runs while the migrations do.
        static = subprocess.Popen(
            [str(servers.BIN / "python"), "manage.py", "collectstatic", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        prod.manage("migrate", "--noinput", "-v", "0")
        prod.manage("demo_setup")
        _, err = static.communicate(timeout=300)
        if static.returncode != 0:
            raise RuntimeError(f"collectstatic failed:\n{err.decode(errors='replace')}")
        yield prod
    finally:
        prod.stop()
        redis_proc.terminate()
        redis_proc.wait(timeout=30)
        servers.drop_postgres_database(database_url)
