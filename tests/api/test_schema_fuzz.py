"""The served OpenAPI schema and the server stay in step (issue 17, point 13; issues 21, 34).

Schemathesis's engine (what `st run` runs) calls the API over HTTP, served from a thread of
the test (`bench.fuzz.serving`), as every persona of the test organisation and as an
anonymous visitor, against an organisation seeded with an object of every kind
(`bench.fuzz.populate`), with DEBUG off as deployed and on as `make run` serves it. Every
check the installed schemathesis has runs on every answer (no 5xx, documented status codes,
content types, headers and bodies, invalid data refused and valid data accepted, `Allow`,
ignored auth, ...), and ours (`bench.fuzz.checks`). The phases here are the examples, fuzzing
and stateful ones, one deterministic case per operation and phase: the same requests on every
run. `python -m bench.fuzz` adds the coverage phase (boundary values, every undocumented
method, OPTIONS included), thousands of requests per persona, on a larger budget.

The engine's thread reads the database through its own connection: the rows are committed
(a transactional test), and the tables emptied after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from schemathesis.core.failures import Failure

from bench.fuzz import PERSONAS, refused_without_credentials, run_here

# The coverage phase sends thousands of requests per persona: `python -m bench.fuzz` runs it.
PHASES = ("examples", "fuzzing", "stateful")


def report(result: dict[str, Any]) -> list[str]:
    return [
        f"{run} {label}: {failure['status']} {failure['operation']} ({failure['phase']}): "
        f"{failure['checks']}\n  {failure['message']}\n  {failure['curl']}\n  -> {failure['body']}"
        for run, tallies in result["runs"].items()
        for label, tally in tallies.items()
        for failure in tally["failures"]
    ] + [
        f"{run} {label}: engine error {error}"
        for run, tallies in result["runs"].items()
        for label, tally in tallies.items()
        for error in tally["errors"]
    ]


@pytest.fixture
def closed_statements_removed_after(transactional_db: Any) -> Iterator[None]:
    """The flush after a transactional test deletes every row, which the triggers that keep
    the books (closed statements, rate versions that priced metered hours) refuse on SQLite
    (PostgreSQL truncates): empty the tables here, the triggers lifted for the moment and put
    back (billing/statements/guards.py)."""
    yield
    from django.core.management import call_command

    from billing.statements.guards import lifted

    with lifted(connection):
        call_command("flush", verbosity=0, interactive=False, inhibit_post_migrate=True)


@pytest.mark.usefixtures("closed_statements_removed_after")
@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
def test_every_operation_answers_as_its_schema_says(debug: bool) -> None:
    # Each pass of `make test` fuzzes the pair it stands for: DEBUG on with the embedded default
    # (SQLite, as `make run` serves it), DEBUG off with PostgreSQL (as deployed). bench.fuzz
    # runs both values on one database.
    sqlite = connection.vendor == "sqlite"
    if debug != sqlite:
        pytest.skip(f"DEBUG {'on' if debug else 'off'} is fuzzed in the other pass of make test")
    result = run_here(examples=1, phases=PHASES, debug=(debug,))
    (tallies,) = result["runs"].values()
    assert set(tallies) == {persona.label for persona in PERSONAS}
    for tally in tallies.values():
        assert tally["requests"] >= tally["operations"] > 90, tally["persona"]
    # Every persona with credentials keeps them to the end, and is answered with data.
    members = ("member", "team-admin", "finance", "platform-admin")
    assert all(tallies[label]["successes"] > 10 for label in members), tallies
    problems = report(result)
    assert not problems, "\n\n".join(problems)


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
