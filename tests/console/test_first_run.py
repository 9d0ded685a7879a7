"""A fresh clone runs: the embedded default creates its state directory, database and secret key."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import httpx
from django.conf import settings

from tests.support.servers import Stack, base_env, free_port, production_env, run_manage

OLD_DEMO_KEY = "django-insecure-embedded-default-key-only-for-local-demo-use"  # noqa: S105


def _print_setting(env: dict[str, str], expression: str) -> str:
    result = run_manage(
        env, "shell", "-c", f"from django.conf import settings; print({expression})"
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_migrate_creates_the_database_directory(tmp_path: Path) -> None:
    database = tmp_path / "not" / "yet" / "there" / "console.sqlite3"
    env = {**base_env(), "SQLITE_PATH": str(database), "STATE_DIR": str(tmp_path / "state")}
    result = run_manage(env, "migrate", "--noinput", "-v", "0")
    assert result.returncode == 0, result.stderr
    assert database.is_file()
    assert (tmp_path / "state" / "mail").is_dir()  # where the embedded default writes mail


def test_embedded_secret_key_is_generated_once_per_install_and_private(tmp_path: Path) -> None:
    env = {**base_env(), "STATE_DIR": str(tmp_path / "state")}
    env.pop("SECRET_KEY", None)
    first = _print_setting(env, "settings.SECRET_KEY")
    again = _print_setting(env, "settings.SECRET_KEY")
    other = _print_setting({**env, "STATE_DIR": str(tmp_path / "other")}, "settings.SECRET_KEY")
    assert first == again  # kept: sessions and signed links survive a restart
    assert first != other  # another install has another key
    assert first != OLD_DEMO_KEY and len(first) >= 50
    key_file = tmp_path / "state" / "secret_key"
    assert key_file.read_text().strip() == first
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_embedded_secret_key_from_the_environment_wins(tmp_path: Path) -> None:
    env = {**base_env(), "STATE_DIR": str(tmp_path / "state"), "SECRET_KEY": "x" * 60}
    assert _print_setting(env, "settings.SECRET_KEY") == "x" * 60
    assert not (tmp_path / "state" / "secret_key").exists()


def test_production_writes_no_key_file_and_still_requires_secret_key(tmp_path: Path) -> None:
    env = production_env("postgres://postgres@127.0.0.1:5432/unused", "redis://127.0.0.1:6379/0")
    env["STATE_DIR"] = str(tmp_path / "state")
    env.pop("SECRET_KEY")
    result = run_manage(env, "check")
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr
    assert not (tmp_path / "state" / "secret_key").exists()


def test_this_process_does_not_use_the_old_fixed_demo_key() -> None:
    from billing.providers.sandbox import sandbox_secret

    assert settings.SECRET_KEY != OLD_DEMO_KEY
    import hashlib
    import hmac

    forged = hmac.new(OLD_DEMO_KEY.encode(), b"billing-sandbox-webhook", hashlib.sha256).digest()
    assert sandbox_secret() != forged


def test_runserver_serves_a_fresh_state_directory(tmp_path: Path) -> None:
    """Django's dev server on a never-used state directory listens and answers (no set-up step)."""
    env = {**base_env(), "STATE_DIR": str(tmp_path / "fresh")}
    run_manage(env, "migrate", "--noinput", "-v", "0")
    stack = Stack(env=env, port=free_port(), tmp=tmp_path)
    stack.spawn(
        "runserver",
        sys.executable,
        "manage.py",
        "runserver",
        "--noreload",
        f"127.0.0.1:{stack.port}",
    )
    try:
        stack.wait_healthy(timeout=60)
        page = httpx.get(f"{stack.url}/static/console/console.js", timeout=10)
        assert page.status_code == 200
    finally:
        stack.stop()
