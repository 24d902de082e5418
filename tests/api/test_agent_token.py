"""The node agent's service-account token (issue 34, item 6), against a fake TokenReview.

Before, every agent pod mounted the whole Secret of per-node tokens: one compromised agent could
report fatal XIDs for every node. Now an agent on Kubernetes sends its pod's projected token;
the API server says whose pod it is and on which node, and the report is taken for that node
only. The real API server's answers are in tests/k8s/test_agent_token_real.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.test.utils import override_settings

from scheduler.models import GpuDevice, Node, NodeAgent
from scheduler.nodes import agent_auth
from scheduler.nodes.agent_auth import ReviewUnavailable, VerdictCache
from tests.api.test_node_agent import body, make_node, post, reading
from tests.conftest import Org

AGENT_SA = "system:serviceaccount:gantry-system:gantry-node-agent"
AUDIENCE = "gantry-agent"
# A refused credential: 403, as for a wrong `Token` (the session's authenticator comes first and
# asks for no WWW-Authenticate challenge).
REFUSED = 403


def jwt(subject: str, exp: int = 4_000_000_000) -> str:
    """A token-shaped string; only its `exp` is read locally (the review decides the rest)."""
    claims = base64.urlsafe_b64encode(json.dumps({"sub": subject, "exp": exp}).encode())
    return f"eyJhbGciOiJSUzI1NiJ9.{claims.decode().rstrip('=')}.signature"


def status(node: str | None = "gpu-a", **changes: Any) -> dict[str, Any]:
    """A TokenReview status for an agent pod's token on `node`."""
    extra = {"authentication.kubernetes.io/pod-name": ["gantry-node-agent-x1"]}
    if node is not None:
        extra["authentication.kubernetes.io/node-name"] = [node]
    answer = {
        "authenticated": True,
        "audiences": [AUDIENCE],
        "user": {"username": AGENT_SA, "extra": extra},
    }
    answer.update(changes)
    return answer


class FakeReviewer:
    """The API server's answers by token; counts the reviews asked for."""

    def __init__(self) -> None:
        self.answers: dict[str, dict[str, Any] | Exception] = {}
        self.asked: list[tuple[str, str]] = []

    def review(self, token: str, audience: str) -> dict[str, Any]:
        self.asked.append((token, audience))
        answer = self.answers.get(token, {"authenticated": False})
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def reviewer(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeReviewer]:
    fake = FakeReviewer()
    monkeypatch.setattr(agent_auth, "_reviewer", fake)
    with override_settings(GANTRY_AGENT_TOKEN_REVIEW=True):
        yield fake


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    now = Clock()
    monkeypatch.setattr(agent_auth, "CACHE", VerdictCache(clock=now))
    return now


@pytest.fixture
def nodes(org: Org) -> tuple[Node, Node]:
    return make_node("gpu-a"), make_node("gpu-b")


def bearer(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def test_a_pods_token_reports_for_the_pods_node(
    nodes: tuple[Node, Node], reviewer: FakeReviewer, clock: Clock
) -> None:
    token = jwt("a")
    reviewer.answers[token] = status("gpu-a")
    response = post(bearer(token), body("gpu-a", reading(0, [79])))
    assert response.status_code == 200, response.json()
    device = GpuDevice.objects.get(node__name="gpu-a", index=0)
    assert (device.healthy, device.health_reason) == (False, "XID 79")
    assert reviewer.asked == [(token, AUDIENCE)]
    assert NodeAgent.objects.get(node_name="gpu-a").user.has_usable_password() is False


def test_a_pods_token_cannot_report_for_another_node_even_from_the_cache(
    nodes: tuple[Node, Node], reviewer: FakeReviewer, clock: Clock
) -> None:
    """The cache keeps who the token is, not what a report said: the second report, answered
    from the cache, is still held to the token's own node."""
    token = jwt("a")
    reviewer.answers[token] = status("gpu-a")
    assert post(bearer(token), body("gpu-a", reading(0))).status_code == 200
    refused = post(bearer(token), body("gpu-b", reading(0, [79])))
    assert refused.status_code == 403
    assert "reports for node 'gpu-a' only" in refused.json()["detail"]
    assert len(reviewer.asked) == 1  # the second came from the cache
    assert not GpuDevice.objects.filter(node__name="gpu-b", healthy=False).exists()
    assert Node.objects.get(name="gpu-b").last_report_at is None


def test_each_token_is_cached_for_its_own_node(
    nodes: tuple[Node, Node], reviewer: FakeReviewer, clock: Clock
) -> None:
    on_a, on_b = jwt("a"), jwt("b")
    reviewer.answers |= {on_a: status("gpu-a"), on_b: status("gpu-b")}
    assert post(bearer(on_a), body("gpu-a", reading(0))).status_code == 200
    assert post(bearer(on_b), body("gpu-b", reading(0))).status_code == 200
    assert post(bearer(on_b), body("gpu-a", reading(0))).status_code == 403
    assert post(bearer(on_a), body("gpu-b", reading(0))).status_code == 403
    assert len(reviewer.asked) == 2


def test_a_verdict_is_kept_a_minute_then_asked_again(
    nodes: tuple[Node, Node], reviewer: FakeReviewer, clock: Clock
) -> None:
    """60 s by default: a deleted pod's token (the API server then refuses it) stops working
    within a minute."""
    token = jwt("a")
    reviewer.answers[token] = status("gpu-a")
    assert post(bearer(token), body("gpu-a", reading(0))).status_code == 200
    clock.now += 59
    assert post(bearer(token), body("gpu-a", reading(0))).status_code == 200
    assert len(reviewer.asked) == 1
    clock.now += 2
    reviewer.answers[token] = {"authenticated": False, "error": "pod not found"}
    assert post(bearer(token), body("gpu-a", reading(0))).status_code == REFUSED
    assert len(reviewer.asked) == 2


def test_a_verdict_never_outlives_the_token(
    nodes: tuple[Node, Node], reviewer: FakeReviewer, clock: Clock
) -> None:
    token = jwt("a", exp=int(clock.now) + 5)
    reviewer.answers[token] = status("gpu-a")
    assert post(bearer(token), body("gpu-a", reading(0))).status_code == 200
    clock.now += 6
    assert post(bearer(token), body("gpu-a", reading(0))).status_code == 200
    assert len(reviewer.asked) == 2


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"authenticated": False}, "not valid"),
        (status(audiences=["https://kubernetes.default.svc"]), "audience"),
        (
            status(user={"username": "system:serviceaccount:team-a:default", "extra": {}}),
            "service account",
        ),
        (status(user={"username": AGENT_SA, "extra": {}}), "not bound to a pod"),
        (status(node=None), "names no node"),
    ],
    ids=["invalid", "other-audience", "other-account", "unbound", "no-node-claim"],
)
def test_tokens_that_are_not_a_bound_agents_are_refused(
    nodes: tuple[Node, Node],
    reviewer: FakeReviewer,
    clock: Clock,
    answer: dict[str, Any],
    why: str,
) -> None:
    token = jwt("x")
    reviewer.answers[token] = answer
    response = post(bearer(token), body("gpu-a", reading(0, [79])))
    assert response.status_code == REFUSED, response.json()
    assert why in response.json()["detail"]
    assert GpuDevice.objects.get(node__name="gpu-a", index=0).healthy
    assert not NodeAgent.objects.exists()


def test_an_unreachable_api_server_is_503_and_not_cached(
    nodes: tuple[Node, Node], reviewer: FakeReviewer, clock: Clock
) -> None:
    token = jwt("a")
    reviewer.answers[token] = ReviewUnavailable("connection refused")
    assert post(bearer(token), body("gpu-a", reading(0))).status_code == 503
    reviewer.answers[token] = status("gpu-a")
    assert post(bearer(token), body("gpu-a", reading(0))).status_code == 200


def test_the_agents_token_opens_no_other_route(
    nodes: tuple[Node, Node], reviewer: FakeReviewer, clock: Clock
) -> None:
    token = jwt("a")
    reviewer.answers[token] = status("gpu-a")
    assert bearer(token).get("/api/v1/jobs/").status_code in (401, 403)
    assert bearer(token).get("/api/v1/nodes/").status_code in (401, 403)
    assert reviewer.asked == []  # never even reviewed there


def test_without_token_review_a_bearer_token_is_not_taken(
    nodes: tuple[Node, Node], reviewer: FakeReviewer, clock: Clock
) -> None:
    """The simulated and embedded installs (no Kubernetes to ask) do not review tokens."""
    token = jwt("a")
    reviewer.answers[token] = status("gpu-a")
    with override_settings(GANTRY_AGENT_TOKEN_REVIEW=False):
        assert post(bearer(token), body("gpu-a", reading(0))).status_code == REFUSED
    assert reviewer.asked == []
