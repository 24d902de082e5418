"""Every HTML answer carries a Content-Security-Policy, and the pages it covers need nothing it
forbids: no inline script anywhere, the API's docs page included (issue 34, item 8)."""

from __future__ import annotations

import re
from typing import Any

from django.test import Client

from tests.conftest import Org

INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", re.I)


def script_src(policy: str) -> str:
    return next(d for d in policy.split(";") if d.strip().startswith("script-src"))


def test_portal_pages_have_a_policy_and_no_inline_script(org: Org) -> None:
    login = Client().get("/accounts/login/")
    policy = login["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe" not in script_src(policy)
    for user in ("alice", "carol", "pat"):  # a member, finance (charts), a platform admin
        client = Client()
        client.force_login(org.users[user])
        for url in ("/", "/jobs/", "/jobs/new/", "/costs/"):
            response = client.get(url)
            assert response.status_code in (200, 403), (user, url)  # /costs/: not a member's
            assert "Content-Security-Policy" in response, (user, url)
            assert not INLINE_SCRIPT.findall(response.content.decode()), (user, url)


def test_the_api_docs_page_runs_no_inline_script(org: Org, client_for: Any) -> None:
    client = client_for("alice")
    page = client.get("/api/v1/docs/")
    assert page.status_code == 200 and "Content-Security-Policy" in page
    html = page.content.decode()
    assert not INLINE_SCRIPT.findall(html)
    (start,) = re.findall(r'<script src="([^"]*script=[^"]*)"', html)
    script = client.get(start.replace("&amp;", "&"))
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle" in script.content.decode()


def test_json_answers_carry_no_policy(org: Org, client_for: Any) -> None:
    assert "Content-Security-Policy" not in client_for("alice").get("/api/v1/me/")
