"""The API while Redis is down (found by bench/chaos, issue 21): the login guard's counts and
the rate-limit windows live in the Redis cache, and Django's RedisCache raised on every call,
so each token login and each API request answered 500 for as long as Redis was away. The
cache now reads as "not cached" meanwhile (common/cache.py): jobs are still accepted and
shown."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from django.core.cache import caches
from django.test import Client, override_settings

from common.cache import TolerantRedisCache, redis_caches
from scheduler.models import Job
from tests.conftest import Org, job_spec

PASSWORD = "correct-horse-battery"  # tests.factories.UserFactory's password


def unreachable_redis() -> str:
    """A Redis URL where nothing listens (a port just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def redis_down() -> Iterator[None]:
    with override_settings(CACHES=redis_caches(unreachable_redis())):
        yield


@pytest.mark.usefixtures("redis_down")
def test_token_login_listing_and_submitting_work_while_redis_is_down(org: Org) -> None:
    client = Client()
    login = client.post(
        "/api/v1/auth/token/", {"username": "alice", "password": PASSWORD}, "application/json"
    )
    assert login.status_code == 200, login.content
    auth = {"authorization": f"Token {login.json()['token']}"}
    assert client.get("/api/v1/jobs/", headers=auth).status_code == 200
    body = json.dumps({"project": org.proj_alpha.pk, "spec": job_spec()})
    submitted = client.post("/api/v1/jobs/", body, "application/json", headers=auth)
    assert submitted.status_code == 201, submitted.content
    shown = client.get(f"/api/v1/jobs/{submitted.json()['id']}/", headers=auth)
    assert shown.status_code == 200
    assert Job.objects.count() == 1


@pytest.mark.usefixtures("redis_down")
def test_the_unreachable_cache_reads_as_empty_and_drops_writes() -> None:
    cache = caches["default"]
    assert isinstance(cache, TolerantRedisCache)
    cache.set("k", 1)
    assert cache.get("k", "missing") == "missing"
    assert cache.add("k", 1) is False
    assert cache.get_many(["k"]) == {}
    with pytest.raises(ValueError, match="not found"):
        cache.incr("k")
