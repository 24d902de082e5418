"""API rate limits (issue 21, security sweep): per user across the session and tokens, per
token, anonymous per address, submissions and node agents' reports in scopes of their own;
429 in the one error shape with Retry-After. The window moves on an injected clock, never on
the wall clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.filebased import FileBasedCache
from django.test import Client
from django.test.utils import override_settings
from rest_framework.settings import api_settings
from rest_framework.test import APIClient

from common.api import throttles
from scheduler.models import Job
from tests.api.test_node_agent import agent_client, body, make_node, post, reading
from tests.conftest import Org, job_spec
from tests.isolation_personas import token_client
from tests.test_settings import manage

pytestmark = pytest.mark.django_db
ME = "/api/v1/me/"
JOBS = "/api/v1/jobs/"
T0 = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(throttles, "clock", fake)
    return fake


@pytest.fixture
def rates() -> Iterator[Any]:
    """rates(user="3/min", ...): the throttle rates for the test, the others left generous."""
    stack: list[Any] = []

    def set_rates(**changed: str) -> None:
        merged = {**api_settings.DEFAULT_THROTTLE_RATES, **changed}
        framework = {**api_settings.user_settings, "DEFAULT_THROTTLE_RATES": merged}
        override = override_settings(REST_FRAMEWORK=framework)
        override.enable()
        stack.append(override)

    yield set_rates
    for override in reversed(stack):
        override.disable()


def assert_throttled(response: Any, retry_after: int) -> None:
    assert response.status_code == 429, response.content
    assert response["Retry-After"] == str(retry_after)
    body = response.json()
    assert set(body) == {"detail"} and "throttled" in body["detail"]


def session(org: Org, username: str) -> Client:
    client = Client()
    client.force_login(org.users[username])
    return client


def test_the_request_past_a_users_limit_is_429_with_retry_after_until_the_window_moves(
    org: Org, clock: Clock, rates: Any
) -> None:
    rates(user="3/min")
    alice = session(org, "alice")
    for _ in range(3):
        assert alice.get(ME).status_code == 200
    clock.now += 20
    # The oldest of the three requests leaves the window at T0 + 60: 40 s from now.
    assert_throttled(alice.get(ME), retry_after=40)
    clock.now = T0 + 60.5
    assert alice.get(ME).status_code == 200
    # Another user's window is their own.
    assert session(org, "bob-bravo").get(ME).status_code == 200


def test_a_token_has_its_own_window_and_the_user_counts_session_and_token_together(
    org: Org, clock: Clock, rates: Any
) -> None:
    rates(user="6/min", token="2/min")
    alice_token, alice_web = token_client(org.users["alice"]), session(org, "alice")
    assert [alice_token.get(ME).status_code for _ in range(2)] == [200, 200]
    assert_throttled(alice_token.get(ME), retry_after=60)
    # The token's window is spent, not the user's: the session goes on ...
    assert [alice_web.get(ME).status_code for _ in range(3)] == [200, 200, 200]
    # ... until the user's six are spent, for both: three by token (the refused one counts
    # too: the user's scope let it through) and three by session.
    assert_throttled(alice_web.get(ME), retry_after=60)
    assert_throttled(alice_token.get(ME), retry_after=60)
    # Bob's token and session are not touched by alice's windows.
    assert token_client(org.users["bob-bravo"]).get(ME).status_code == 200
    assert session(org, "bob-bravo").get(ME).status_code == 200


def test_anonymous_requests_are_counted_per_address(org: Org, clock: Clock, rates: Any) -> None:
    rates(anon="2/min")
    one, other = APIClient(REMOTE_ADDR="198.51.100.7"), APIClient(REMOTE_ADDR="198.51.100.8")
    schema = "/api/v1/schema/?format=json"
    assert [one.get(schema).status_code for _ in range(2)] == [200, 200]
    assert_throttled(one.get(schema), retry_after=60)
    assert other.get(schema).status_code == 200
    clock.now += 61
    assert one.get(schema).status_code == 200


def test_submissions_have_a_scope_of_their_own(org: Org, clock: Clock, rates: Any) -> None:
    rates(submit="2/min")
    alice = session(org, "alice")

    def submit(name: str) -> Any:
        spec = job_spec(name=name, replicas=1, resources={"gpus": 1})
        return alice.post(
            JOBS, {"project": org.proj_alpha.pk, "spec": spec}, content_type="application/json"
        )

    assert [submit(f"job-{i}").status_code for i in range(2)] == [201, 201]
    assert_throttled(submit("job-2"), retry_after=60)
    assert Job.objects.count() == 2  # the refused one created nothing
    assert alice.get(JOBS).status_code == 200  # reading is another scope
    clock.now += 60.5
    assert submit("job-3").status_code == 201


def test_node_agents_are_counted_per_node_apart_from_their_users_limit(
    org: Org, clock: Clock, rates: Any
) -> None:
    rates(user="1/min", token="1/min", agent="2/min")
    make_node("n1", gpus=1), make_node("n2", gpus=1)
    n1, n2 = agent_client("n1"), agent_client("n2")
    assert [post(n1, body("n1", reading(0))).status_code for _ in range(2)] == [200, 200]
    assert_throttled(post(n1, body("n1", reading(0))), retry_after=60)
    # The other node's agent has its own window.
    assert post(n2, body("n2", reading(0))).status_code == 200


def test_the_schema_documents_429_with_retry_after_on_every_operation(
    org: Org, clock: Clock
) -> None:
    client = APIClient()
    client.force_authenticate(org.users["pat"])
    schema = client.get("/api/v1/schema/?format=json").json()
    operations = [op for path in schema["paths"].values() for op in path.values()]
    assert len(operations) > 50
    for operation in operations:
        answer = operation["responses"]["429"]
        assert answer["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }
    submit = schema["paths"]["/api/v1/jobs/"]["post"]["responses"]["429"]
    assert "Retry-After" in submit["headers"]


SHOW_THROTTLE_SETTINGS = """
import json
from django.conf import settings
from django.core.cache import caches
caches["throttle"].set("written-by-another-process", [1.5])
print(json.dumps({
    "backend": settings.CACHES["throttle"]["BACKEND"],
    "rates": settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
}))
"""


def test_the_embedded_defaults_throttle_counts_are_shared_between_processes(
    tmp_path: Path,
) -> None:
    """Without REDIS_URL the counts live in files under GANTRY_VAR_DIR: what one web process
    wrote, another reads (in process memory each would count a window of its own)."""
    result = manage(
        "shell", "-c", SHOW_THROTTLE_SETTINGS,
        env={"GANTRY_VAR_DIR": str(tmp_path), "GANTRY_THROTTLE_SUBMIT": "7/min"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown["backend"] == "django.core.cache.backends.filebased.FileBasedCache"
    assert shown["rates"]["submit"] == "7/min"
    here = FileBasedCache(str(tmp_path / "throttle"), {})
    assert here.get("written-by-another-process") == [1.5]


def test_with_redis_the_throttle_counts_are_in_redis() -> None:
    result = manage(
        "shell", "-c", "from django.conf import settings; print(settings.CACHES['throttle'])",
        env={"REDIS_URL": "redis://redis.example.com:6379/0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "RedisCache" in result.stdout and "redis://redis.example.com:6379/0" in result.stdout
