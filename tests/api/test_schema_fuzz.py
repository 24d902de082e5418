"""The served OpenAPI schema and the server stay in step (issue 17, point 13).

Schemathesis generates requests from `/api/v1/schema/` for every operation, as a member and as
a platform admin, and checks every answer: no 5xx, a status code the schema documents, the
declared content type, and a body that matches the declared schema (nullable fields included).
Bounded and derandomized: a few examples per operation, the same ones on every run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.cache import cache
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from scheduler.models import GpuDevice
from scheduler.services import job_submit
from tenants.approval_policies import policy_set
from tests import factories as f
from tests.conftest import Org, job_spec

EXAMPLES_PER_OPERATION = 4
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def wsgi_in_the_test_transaction() -> Iterator[None]:
    """Requests go through the WSGI handler, which closes the database connection when a
    request ends, and with it the test's transaction; Django's test client turns this off too."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def populate(org: Org) -> None:
    """A little of everything, so that lists and details answer with real rows."""
    for number in range(2):
        node = f.NodeFactory(name=f"h100-{number}")
        for index in range(2):
            GpuDevice.objects.create(node=node, index=index, model="H100-80GB", memory_mib=81920)
    spec = job_spec(replicas=1, resources={"gpus": 1, "cpu_milli": 1000, "memory_mib": 4096})
    job, _ = job_submit(user=org.users["alice"], project=org.proj_alpha, payload=spec)
    f.JobEventFactory(job=job, kind="note", actor=None, message="by the daemon")
    # A policy without a priority class sends the next job to approval: a request not decided.
    policy_set(user=org.users["tina"], tenant=org.alpha, rule="gpus_over", threshold=0)
    job_submit(user=org.users["alice"], project=org.proj_alpha, payload={**spec, "name": "big"})


def failures_for(schema: Any, token: str) -> list[str]:
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def call(case: Any) -> None:
            case.call_and_validate(headers={"Authorization": f"Token {token}"}, checks=CHECKS)

        try:
            call()
        except (Exception, BaseExceptionGroup) as exc:  # every operation is tried; all reported
            failures.append(f"{operation.label}: {str(exc)[:1500]}")
    return failures


@pytest.mark.parametrize("persona", ["alice", "pat"], ids=["member", "platform-admin"])
@pytest.mark.usefixtures("wsgi_in_the_test_transaction")
def test_every_operation_answers_as_its_schema_says(org: Org, persona: str) -> None:
    populate(org)
    cache.clear()
    token = Token.objects.create(user=org.users[persona]).key
    schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", get_wsgi_application())
    failures = failures_for(schema, token)
    assert not failures, "\n\n".join(failures)
