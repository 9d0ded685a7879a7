"""Configuration: production settings pass Django's deployment checklist; bad values fail loudly."""

from __future__ import annotations

import pytest
from django.conf import settings

from console.celery import app as celery_app
from tests.support.servers import base_env, production_env, run_manage

PG = "postgres://postgres@127.0.0.1:5432/unused"
PROD = {
    "DATABASE_URL": PG,
    "REDIS_URL": "redis://x",
    "SECRET_KEY": "s" * 60,
    "APPS_DOMAIN": "example-apps.com",
}


def test_check_deploy_is_clean_with_production_settings() -> None:
    env = production_env(PG, "redis://127.0.0.1:6379/0")
    for key in ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
        env.pop(key)  # production defaults, not the integration-test overrides
    result = run_manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_api_schema_builds_without_warnings(tmp_path) -> None:
    """Two serializers sharing a component name make a wrong OpenAPI document (drf-spectacular
    W001, which fails the deployment check above): the schema is built here without PostgreSQL."""
    env = base_env()
    env["SQLITE_PATH"] = str(tmp_path / "console.sqlite3")
    out = tmp_path / "schema.yml"
    result = run_manage(env, "spectacular", "--fail-on-warn", "--validate", "--file", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "/api/v1/reservations/" in out.read_text()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"DATABASE_URL": PG}, "REDIS_URL"),
        ({"DATABASE_URL": "mysql://root@localhost/x", "REDIS_URL": "redis://x"}, "DATABASE_URL"),
        ({"DATABASE_URL": PG, "REDIS_URL": "http://x"}, "REDIS_URL"),
        ({"DATABASE_URL": PG, "REDIS_URL": "redis://x", "SECRET_KEY": "short"}, "SECRET_KEY"),
        ({"DEBUG": "perhaps"}, "DEBUG"),
        ({"EMBEDDED_WORKER_THREADS": "many"}, "EMBEDDED_WORKER_THREADS"),
        ({"CELERY_BROKER_URL": "ftp://x"}, "CELERY_BROKER_URL"),
        ({**PROD, "DB_POOL_MAX_SIZE": "0"}, "DB_POOL_MAX_SIZE"),
        ({**PROD, "DB_POOL_MIN_SIZE": "20"}, "DB_POOL_MIN_SIZE"),
        ({**PROD, "DB_POOL_TIMEOUT": "soon"}, "DB_POOL_TIMEOUT"),
        ({**PROD, "DB_CONN_MAX_AGE": "60"}, "DB_CONN_MAX_AGE"),  # the pool needs 0
        ({**PROD, "DB_POOL": "false", "DB_CONN_MAX_AGE": "-1"}, "DB_CONN_MAX_AGE"),
        ({"API_QUEUE_TIMEOUT": "0"}, "API_QUEUE_TIMEOUT"),
        ({"API_THREADS": "0"}, "API_THREADS"),
        ({**PROD, "DB_PREPARED": "sometimes"}, "DB_PREPARED"),
    ],
)
def test_bad_configuration_fails_at_start_naming_the_variable(overrides: dict, named: str) -> None:
    env = {**base_env(), **overrides}
    result = run_manage(env, "check")
    assert result.returncode != 0
    assert named in result.stderr


def test_embedded_default_needs_no_configuration() -> None:
    result = run_manage(base_env(), "check")
    assert result.returncode == 0, result.stderr


def test_task_timings_stay_below_the_broker_visibility_timeout() -> None:
    """A task that outlives the visibility timeout would be redelivered while still running."""
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert settings.CELERY_TASK_TIME_LIMIT < visibility
    assert settings.CELERY_TASK_SOFT_TIME_LIMIT < settings.CELERY_TASK_TIME_LIMIT
    for name, task in celery_app.tasks.items():
        if name.startswith("celery."):
            continue
        for attr in ("default_retry_delay", "time_limit", "soft_time_limit"):
            value = getattr(task, attr, None)
            assert value is None or value < visibility, (name, attr, value)
        max_backoff = getattr(task, "retry_backoff_max", None)
        assert max_backoff is None or max_backoff < visibility, name
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        countdown = (entry.get("options") or {}).get("countdown", 0)
        assert countdown < visibility


def test_celery_accepts_only_json() -> None:
    assert celery_app.conf.accept_content == ["json"]
    assert celery_app.conf.task_serializer == "json"
    assert celery_app.conf.task_acks_late is True
