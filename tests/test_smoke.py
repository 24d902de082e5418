import os
from typing import Any

from tests.conftest import Org, job_spec


def test_member_submits_and_sees_own_job(org: Org, client_for: Any) -> None:
    client = client_for("alice")
    response = client.post(
        "/api/v1/jobs/", {"project": org.proj_alpha.pk, "spec": job_spec()}, format="json"
    )
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["state"] == "queued"
    assert job["priority_class"] == "normal"
    assert job["gpus_total"] == 8
    listed = client.get("/api/v1/jobs/").json()
    assert [j["id"] for j in listed["results"]] == [job["id"]]


def test_openapi_schema_lists_the_job_routes(org: Org, client_for: Any) -> None:
    response = client_for("alice").get(
        "/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json"
    )
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert {"/api/v1/jobs/", "/api/v1/jobs/{id}/cancel/", "/api/v1/quotas/"} <= set(schema["paths"])


def test_api_docs_page_is_served_offline(org: Org, client_for: Any) -> None:
    response = client_for("alice").get("/api/v1/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    assert "cdn." not in html and "unpkg" not in html and "jsdelivr" not in html


def test_healthz_reports_database(db: Any) -> None:
    from django.test import Client

    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json()["database"] == "ok"


def test_healthz_is_degraded_not_down_when_redis_is_unreachable(db: Any, settings: Any) -> None:
    from django.test import Client

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = Client().get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["database"]) == ("degraded", "ok")
    assert body["broker"].startswith("unreachable")


def test_the_broker_probe_closes_its_connection(settings: Any, monkeypatch: Any) -> None:
    """Each probe's Redis client is closed before it returns, reachable or not: left to the
    garbage collector, its socket stayed open until a collection, one per health probe."""
    import redis

    from common.views import broker_status

    made: list[Any] = []
    closed: list[Any] = []
    from_url, close = redis.Redis.from_url, redis.Redis.close

    def recorded(*args: Any, **kwargs: Any) -> Any:
        made.append(from_url(*args, **kwargs))
        return made[-1]

    def closing(client: Any) -> None:
        closed.append(client)
        close(client)

    monkeypatch.setattr(redis.Redis, "from_url", recorded)
    monkeypatch.setattr(redis.Redis, "close", closing)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    assert broker_status().startswith("unreachable")
    if os.environ.get("REDIS_URL"):
        settings.REDIS_URL = os.environ["REDIS_URL"]
        assert broker_status() == "ok"
    assert made and closed == made
