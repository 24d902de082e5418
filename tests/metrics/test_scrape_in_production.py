"""Prometheus scrapes /metrics over plain HTTP inside the cluster (platform/monitoring/
prometheus.yml, docs/deployment.md); production's HTTPS redirect sent it to an https URL
that the in-cluster service does not serve, so no scrape ever succeeded."""

from __future__ import annotations

from tests.test_settings import PRODUCTION_ENV, manage

PROBE = (
    "from django.middleware.security import SecurityMiddleware;"
    "from django.test import RequestFactory;"
    "m = SecurityMiddleware(lambda r: None);"
    "print([type(m.process_request(RequestFactory().get(p, HTTP_HOST='gantry.example.com')))"
    ".__name__ for p in ('/metrics', '/healthz', '/api/v1/nodes/report/', '/api/v1/jobs/')])"
)


def test_production_does_not_redirect_the_scrape_to_https() -> None:
    result = manage("shell", "-c", PROBE, env=PRODUCTION_ENV)
    assert result.returncode == 0, result.stderr
    # /metrics, /healthz and the node agents' report are answered over HTTP (the agents post
    # to the in-cluster service); everything else still goes to HTTPS.
    answered = result.stdout.strip().splitlines()[-1]
    assert answered == "['NoneType', 'NoneType', 'NoneType', 'HttpResponsePermanentRedirect']"
