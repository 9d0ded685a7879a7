"""Start the console as real processes (ASGI server, Celery worker) for end-to-end tests."""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a fresh loop in its own thread.

    The browser tests' sync Playwright keeps an event loop running on the main thread, where
    ``asyncio.run`` refuses to start.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_redis(workdir: Path, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of our own on a free loopback port (or ``port``: the same one again, after
    a test killed it), saving nothing, answering pings; the process (the caller stops it) and
    its URL."""
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("redis-server is required (make system-deps)")
    port = port or free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def wait_healthy(url: str, timeout: float = 60, alive: Callable[[], bool] | None = None) -> None:
    """Until the console at ``url`` answers /healthz with 200; RuntimeError if that takes over
    ``timeout`` seconds or ``alive`` says its process has gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"the server at {url} exited")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} was not healthy within {timeout:.0f} s")


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL"))}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # browser-test fixtures set it for this process only
    env["PYTHONUNBUFFERED"] = "1"
    env["LOG_LEVEL"] = "WARNING"
    return env


def embedded_env(tmp_path: Path) -> dict[str, str]:
    env = base_env()
    env["SQLITE_PATH"] = str(tmp_path / "console.sqlite3")
    return env


def production_env(database_url: str, redis_url: str) -> dict[str, str]:
    env = base_env()
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        SECRET_KEY="it-" + uuid.uuid4().hex * 2,
        SECURE_SSL_REDIRECT="false",
        SESSION_COOKIE_SECURE="false",
        CSRF_COOKIE_SECURE="false",
        ALLOWED_HOSTS="127.0.0.1",
        APPS_DOMAIN="localhost",
    )
    return env


def create_postgres_database(server_url: str) -> str:
    """Create a fresh database next to ``server_url``'s and return its URL."""
    import psycopg

    parts = urlsplit(server_url)
    name = f"gc_srv_{uuid.uuid4().hex[:10]}"
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path=f"/{name}"))


def drop_postgres_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    name = parts.path.lstrip("/")
    assert re.fullmatch(r"gc_srv_[0-9a-f]{10}", name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py *args`` in a process of its own with ``env``; the caller checks the outcome."""
    return subprocess.run(
        [str(BIN / "python"), "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def manage(env: dict[str, str], *args: str) -> str:
    """``manage.py *args`` that must succeed; its standard output."""
    result = run_manage(env, *args)
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


_migrated_lock = threading.Lock()
_migrated_template: Path | None = None


def migrate(env: dict[str, str]) -> None:
    """``manage.py migrate`` for a server of ``env``. An embedded one (``SQLITE_PATH``) gets a copy
    of a database this process migrated once (the migrations write the same rows whatever the
    environment; 3 s of CPU a run); a production one (``DATABASE_URL``) is migrated in place."""
    global _migrated_template
    target = env.get("SQLITE_PATH")
    if env.get("DATABASE_URL") or not target:
        manage(env, "migrate", "--noinput", "-v", "0")
        return
    with _migrated_lock:
        if _migrated_template is None:
            work = Path(tempfile.mkdtemp(prefix="gpc-migrated-"))
            atexit.register(shutil.rmtree, work, True)
            manage(embedded_env(work), "migrate", "--noinput", "-v", "0")
            _migrated_template = work / "console.sqlite3"
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        # SQLite's backup API: a consistent copy of the pages (the file, its WAL and all).
        with (
            closing(sqlite3.connect(_migrated_template)) as source,
            closing(sqlite3.connect(target)) as copy,
        ):
            source.backup(copy)


def create_superuser(env: dict[str, str], username: str, password: str) -> None:
    manage(
        {**env, "DJANGO_SUPERUSER_PASSWORD": password},
        "createsuperuser",
        "--noinput",
        "--username",
        username,
        "--email",
        f"{username}@example.com",
    )


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@dataclass
class Stack:
    """A running console: the ASGI server and, in production mode, a Celery worker."""

    env: dict[str, str]
    port: int
    tmp: Path
    procs: list[Proc] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, name: str, *argv: str) -> Proc:
        log = self.tmp / f"{name}.log"
        handle = log.open("wb")
        popen = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_web(self) -> None:
        self.spawn(
            "web",
            str(BIN / "uvicorn"),
            "console.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        )
        self.wait_healthy()

    def start_worker(self) -> None:
        self.spawn(
            "worker",
            str(BIN / "celery"),
            "-A",
            "console",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"it-{uuid.uuid4().hex[:6]}@%h",
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "ready" in self.procs[-1].output():
                return
            self._check_alive()
            time.sleep(0.2)
        raise RuntimeError(f"celery worker did not become ready:\n{self.procs[-1].output()}")

    def wait_healthy(self, timeout: float = 60) -> None:
        try:
            wait_healthy(self.url, timeout, alive=self._alive)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{self.logs()}") from None

    def _alive(self) -> bool:
        return all(proc.popen.poll() is None for proc in self.procs)

    def _check_alive(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited early:\n{proc.output()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.output()}" for p in self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.popen.poll() is None:
                proc.popen.terminate()
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=5)


def login(client: httpx.Client, username: str, password: str) -> None:
    """Log in through the admin's login form (a real CSRF round-trip)."""
    page = client.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    response = client.post(
        "/admin/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": token,
            "next": "/admin/",
        },
        headers={"Referer": f"{client.base_url}/admin/login/"},
    )
    assert response.status_code == 302, response.text[:500]


# The logins ``demo_setup`` creates (console/management/commands/demo_setup.py), username: password.
DEMO_LOGINS = {"demo": "demo-password-2026", "ops": "ops-password-2026"}


@contextmanager
def embedded_demo(tmp: Path, **env: str) -> Iterator[Stack]:
    """The embedded console with the demo data (``demo_setup``) as a real server process, with
    ``env`` on top of the embedded defaults; stopped on exit. A loaded machine gets 240 s to
    become healthy."""
    environ = embedded_env(tmp)
    environ.update(env)
    migrate(environ)
    manage(environ, "demo_setup")
    stack = Stack(env=environ, port=free_port(), tmp=tmp)
    try:
        try:
            stack.start_web()
        except RuntimeError:  # not healthy within 60 s
            stack.wait_healthy(timeout=240)
        yield stack
    finally:
        stack.stop()
