"""The node agent's credential on Kubernetes: its pod's projected service-account token.

Each agent pod mounts a token the kubelet mints for it (audience `gantry-agent`, ten minutes,
rotated by the kubelet: platform/k8s/30-node-agent.yaml) and sends it as `Authorization: Bearer`.
The pod cannot choose what the token says: the API server signed it for that pod, on that node.
The web asks the API server about it (a TokenReview with our audience) and takes it only when
- it is valid, unexpired, for our audience, and its pod still exists (the API server checks);
- its user is the node agent's service account (GANTRY_AGENT_SERVICE_ACCOUNT);
- it is bound to a pod, and names the pod's node (`authentication.kubernetes.io/node-name`,
  which Kubernetes 1.32 and later put into every pod-bound token).
The report is then taken as that node's agent (its NodeAgent account, made on first use), and
`scheduler.nodes.services.require_reporter` refuses a report for any other node (403).

Verdicts are kept GANTRY_AGENT_TOKEN_CACHE_S (60 s by default; never past the token's own
expiry) per token digest, so that a report does not cost an API call; a refusal for a shorter
while. The cache holds who the token is, never which node a report named: a cached token still
speaks for its own node only.

Tokens of `manage.py node_agent_token` (DRF's `Token` scheme) still work for agents outside
Kubernetes (the simulated and embedded installs, bare-metal nodes); on Kubernetes none is needed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.request import Request

from scheduler.models import NodeAgent

POD_NAME = "authentication.kubernetes.io/pod-name"
NODE_NAME = "authentication.kubernetes.io/node-name"
REFUSAL_CACHE_S = 10.0
MAX_CACHED = 10_000  # tokens; a cluster's agents hold one or two each


@dataclass(frozen=True)
class AgentIdentity:
    """What the API server said about a token that is a node agent's."""

    node: str
    pod: str


class AgentTokenRejected(Exception):
    """The token is not a node agent's (the message says why; it is shown to the caller)."""


class ReviewUnavailable(Exception):
    """The API server could not be asked (the caller answers 503; the agent tries again)."""


class TokenReviewer(Protocol):
    def review(self, token: str, audience: str) -> dict[str, Any]:
        """The TokenReview's status; ReviewUnavailable when the API server cannot answer."""


class KubernetesTokenReviewer:
    """TokenReviews through the official client (the web's own service account in-cluster)."""

    def __init__(self, api_client: Any = None, timeout_s: float = 5.0) -> None:
        from kubernetes import client

        from scheduler.backends.kubernetes.backend import api_client_from_environment

        self.api = client.AuthenticationV1Api(api_client or api_client_from_environment())
        self.timeout_s = timeout_s

    def review(self, token: str, audience: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        body: Any = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        try:
            # The raw urllib3 response (_preload_content=False), typed by the client as a model.
            response: Any = self.api.create_token_review(
                body, _preload_content=False, _request_timeout=self.timeout_s
            )
            try:
                status: dict[str, Any] = json.loads(response.data).get("status") or {}
            finally:
                response.release_conn()
        except (ApiException, HTTPError, OSError, ValueError) as exc:
            raise ReviewUnavailable(f"the TokenReview failed: {exc}") from exc
        return status


def identity_of(status: dict[str, Any], audience: str) -> AgentIdentity:
    """The agent a TokenReview's status describes; AgentTokenRejected when it is none."""
    if not status.get("authenticated"):
        raise AgentTokenRejected("the token is not valid (expired, revoked or not for Gantry)")
    if audience not in (status.get("audiences") or ()):
        raise AgentTokenRejected(f"the token is not for the audience {audience!r}")
    user = status.get("user") or {}
    if user.get("username") != settings.GANTRY_AGENT_SERVICE_ACCOUNT:
        raise AgentTokenRejected("the token is not the node agent's service account's")
    extra = user.get("extra") or {}
    pods, nodes = extra.get(POD_NAME) or [], extra.get(NODE_NAME) or []
    if len(pods) != 1:
        raise AgentTokenRejected("the token is not bound to a pod")
    if len(nodes) != 1:
        raise AgentTokenRejected(
            "the token names no node (Kubernetes 1.32 or later binds a pod's node into its "
            "service-account tokens)"
        )
    return AgentIdentity(node=str(nodes[0]), pod=str(pods[0]))


def _expiry(token: str) -> float | None:
    """The token's `exp` claim, read without checking the signature (the API server did): it
    only shortens how long a verdict is kept."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, KeyError, TypeError, ValueError):
        return None


class VerdictCache:
    """Verdicts per token digest (module docstring), bounded, thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, tuple[float, AgentIdentity | str]] = {}

    def get(self, key: str) -> AgentIdentity | str | None:
        with self._lock:
            held = self._held.get(key)
            if held is None or held[0] <= self.clock():
                self._held.pop(key, None)
                return None
            return held[1]

    def put(self, key: str, verdict: AgentIdentity | str, until: float) -> None:
        with self._lock:
            if len(self._held) >= MAX_CACHED:
                now = self.clock()
                self._held = {k: v for k, v in self._held.items() if v[0] > now}
                if len(self._held) >= MAX_CACHED:
                    self._held.clear()
            self._held[key] = (until, verdict)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


CACHE = VerdictCache()
_reviewer: TokenReviewer | None = None


def reviewer() -> TokenReviewer:
    """The process's reviewer, made on first use (tests set `_reviewer`)."""
    global _reviewer
    if _reviewer is None:
        _reviewer = KubernetesTokenReviewer()
    return _reviewer


def verify_agent_token(token: str, *, cache: VerdictCache | None = None) -> AgentIdentity:
    """The agent `token` belongs to, from the cache (the process's CACHE by default) or a
    TokenReview; AgentTokenRejected or ReviewUnavailable otherwise."""
    cache = cache or CACHE
    key = hashlib.sha256(token.encode()).hexdigest()
    held = cache.get(key)
    if isinstance(held, AgentIdentity):
        return held
    if isinstance(held, str):
        raise AgentTokenRejected(held)
    audience = settings.GANTRY_AGENT_TOKEN_AUDIENCE
    now = cache.clock()
    try:
        identity = identity_of(reviewer().review(token, audience), audience)
    except AgentTokenRejected as exc:
        cache.put(key, str(exc), now + REFUSAL_CACHE_S)
        raise
    until = now + settings.GANTRY_AGENT_TOKEN_CACHE_S
    expires = _expiry(token)
    cache.put(key, identity, until if expires is None else min(until, expires))
    return identity


def agent_username(node: str) -> str:
    """`node-agent:<node>`, shortened with a digest when the node name is long (usernames
    hold 150 characters)."""
    name = f"node-agent:{node}"
    if len(name) <= 150:
        return name
    return f"node-agent:{node[:100]}~{hashlib.sha256(node.encode()).hexdigest()[:16]}"


def agent_account(node: str) -> Any:
    """The NodeAgent account of `node` (made on its agent's first verified report): what the
    report endpoint and its throttle know an agent by."""
    found = NodeAgent.objects.select_related("user").filter(node_name=node).first()
    if found is not None:
        return found.user
    try:
        with transaction.atomic():
            user = get_user_model().objects.create(username=agent_username(node))
            user.set_unusable_password()
            user.save(update_fields=["password"])
            return NodeAgent.objects.create(user=user, node_name=node).user
    except IntegrityError:  # another report of the same node made it first
        return NodeAgent.objects.select_related("user").get(node_name=node).user


class AgentTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <service-account token>` on the node report (module docstring).
    Any other header is left to the other authenticators."""

    def authenticate(self, request: Request) -> tuple[Any, AgentIdentity] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != b"bearer" or not settings.GANTRY_AGENT_TOKEN_REVIEW:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Bearer takes one token, without spaces.")
        try:
            token = parts[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed("The token is not ASCII.") from exc
        try:
            identity = verify_agent_token(token)
        except AgentTokenRejected as exc:
            raise AuthenticationFailed(f"Not a node agent's token: {exc}.") from exc
        except ReviewUnavailable as exc:
            raise ReviewPending() from exc
        return agent_account(identity.node), identity

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class ReviewPending(APIException):
    status_code = 503
    default_detail = "The node agent's token could not be verified now; try again."
    default_code = "token_review_unavailable"


class AgentTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """The schema's name for AgentTokenAuthentication (the report route only)."""

    target_class = AgentTokenAuthentication
    name = "nodeAgentServiceAccountToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": "A node agent pod's projected service-account token (audience "
            "gantry-agent), verified with a TokenReview; reports for the pod's node only.",
        }
