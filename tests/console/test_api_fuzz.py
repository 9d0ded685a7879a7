"""Schema-driven fuzzing of the whole API (schemathesis against our OpenAPI document).

Every operation of the schema is called with inputs generated from it, authenticated with a real
API token, in-process over WSGI; any server error (5xx) fails the run with the request that caused
it. Inputs are derandomised (the same on every run); set ``API_FUZZ_SEED`` to explore others.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings

from console.services import create_api_token
from console.wsgi import application

pytestmark = pytest.mark.django_db

EXAMPLES_PER_OPERATION = int(os.environ.get("API_FUZZ_EXAMPLES", "25"))
SEED = os.environ.get("API_FUZZ_SEED")


def _console(environ: dict[str, Any], start_response: Any) -> Any:
    """The WSGI app on the console's host: werkzeug's test client says ``localhost``, which is
    the embedded default's apps domain (issue 29), not the console."""
    environ["HTTP_HOST"] = "testserver"
    return application(environ, start_response)


def _operations() -> list[Any]:
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", _console)
    return [result.ok() for result in schema.get_all_operations()]


def test_api_never_answers_a_server_error(alice) -> None:
    _, raw = create_api_token(alice, name="fuzz")
    headers = {"Authorization": f"Token {raw}"}
    operations = _operations()
    assert len(operations) >= 15
    failures: list[str] = []
    statuses: Counter[int] = Counter()

    def fuzz(operation: Any) -> None:
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=SEED is None,
            database=None,
        )
        @given(case=operation.as_strategy())
        def run(case: Any) -> None:
            response = case.call(headers=headers)
            statuses[response.status_code] += 1
            if response.status_code >= 500:
                failures.append(
                    f"{operation.method.upper()} {case.formatted_path} "
                    f"query={case.query} body={case.body!r} -> {response.status_code}"
                )

        (seed(int(SEED))(run) if SEED is not None else run)()

    for operation in operations:
        fuzz(operation)

    assert not failures, "\n".join(failures[:20])
    # The run really exercised the API as an authenticated user, not only its error paths.
    assert statuses[200] + statuses[201] + statuses[202] > len(operations), statuses
    assert statuses[401] == 0, statuses
    print(
        f"api fuzz: {len(operations)} operations, {sum(statuses.values())} cases, "
        f"responses by status {dict(statuses)}"
    )
