"""The served OpenAPI schema and the server stay in step (issue 17, point 13; issue 21).

Schemathesis generates requests from `/api/v1/schema/` for every operation, as every persona
of the test organisation and as an anonymous visitor, and checks every answer: no 5xx, a
status code the schema documents, the declared content type, a body that matches the declared
schema (nullable fields included); invalid data is refused with a 4xx; and without credentials
an operation that needs them answers 401 or 403. Then a few sequences of calls chained by the
links schemathesis infers (a job's id from the list into its detail and its cancel), so that
details and actions also meet rows that exist. Bounded and derandomized: a few examples per
operation, the same ones on every run; `python -m bench.fuzz` runs a longer random budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.core import signals
from django.core.cache import cache
from django.db import close_old_connections
from schemathesis.core.failures import Failure

from bench.fuzz import (
    PERSONAS,
    Persona,
    credentials,
    fuzz_persona,
    generous_rates,
    populate,
    refused_without_credentials,
    served_schema,
)
from tests.conftest import Org

# persona label -> (valid examples, invalid examples) per operation, and sequences of linked
# calls. The member and the platform admin reach the most code (submissions; the writes of
# every setting) and get the most, invalid data and sequences included; every other persona
# gets one example per operation: the tenant admins' subtree writes are the platform admin's
# code behind another scope, and the others' answers are mostly refusals.
BUDGET = {
    "member": (4, 1, 8),
    "approver": (1, 0, 0),
    "team-admin": (1, 0, 0),
    "department-admin": (1, 0, 0),
    "finance": (1, 0, 0),
    "platform-admin": (4, 1, 8),
    "no-membership": (1, 0, 0),
    "node-agent": (1, 0, 0),
    "anonymous": (1, 0, 0),
}
_SCHEMA: list[Any] = []  # loaded once per process: every persona fuzzes the same schema


@pytest.fixture
def wsgi_in_the_test_transaction() -> Iterator[None]:
    """Requests go through the WSGI handler, which closes the database connection when a
    request ends, and with it the test's transaction; Django's test client turns this off too."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def generous_rate_limits(settings: Any) -> None:
    settings.REST_FRAMEWORK = generous_rates(settings.REST_FRAMEWORK)


def schema() -> Any:
    if not _SCHEMA:
        _SCHEMA.append(served_schema())
    return _SCHEMA[0]


def test_every_persona_has_a_budget() -> None:
    assert set(BUDGET) == {persona.label for persona in PERSONAS}


@pytest.mark.parametrize("persona", PERSONAS, ids=[persona.label for persona in PERSONAS])
@pytest.mark.usefixtures("wsgi_in_the_test_transaction", "generous_rate_limits")
def test_every_operation_answers_as_its_schema_says(org: Org, persona: Persona) -> None:
    populate(org)
    cache.clear()
    examples, negative, stateful = BUDGET[persona.label]
    tally = fuzz_persona(
        schema(),
        persona=persona,
        headers=credentials(org, persona),
        examples=examples,
        negative=negative,
        stateful=stateful,
    )
    assert tally.requests >= tally.operations > 0
    report = [
        f"{failure['status']} {failure['operation']} ({failure['mode']}): {failure['checks']}\n"
        f"  {failure['message']}\n  {failure['curl']}\n  -> {failure['body']}"
        for failure in tally.failures
    ]
    assert not report, "\n\n".join(report)


@pytest.mark.parametrize(
    ("status", "security", "refused"),
    [
        (200, [{"tokenAuth": []}], False),
        (400, [{"tokenAuth": []}], False),  # the request was read before the caller was asked
        (401, [{"tokenAuth": []}], True),
        (403, [{"tokenAuth": []}], True),
        (200, [{}], True),  # an operation open to anyone (auth/token/)
    ],
)
def test_the_anonymous_check_refuses_an_answer_given_without_credentials(
    status: int, security: list[dict[str, Any]], refused: bool
) -> None:
    case = SimpleNamespace(
        meta=None,
        operation=SimpleNamespace(
            label="GET /api/v1/jobs/",
            definition=SimpleNamespace(raw={"security": security}),
            schema=SimpleNamespace(raw_schema={}),
        ),
    )
    response = SimpleNamespace(status_code=status, request=SimpleNamespace(headers={}))
    if refused:
        refused_without_credentials(None, response, case)
    else:
        with pytest.raises(Failure, match="without credentials"):
            refused_without_credentials(None, response, case)
