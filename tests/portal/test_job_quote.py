"""The submit form's Quote button: cost range, approval and why, budget left, in the form,
with nothing submitted (issue 18)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from html import unescape as html_unescape
from typing import Any

import pytest
from django.urls import reverse

from billing.budgets import checks as admission
from billing.models import Budget, BudgetPolicy
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.models import Job, JobEvent
from tenants.approval_policies import policy_set
from tenants.models import ApprovalRequest, AuditEntry
from tests.conftest import Org
from tests.portal.test_jobs import form_body

NOW = datetime(2031, 2, 10, 12, tzinfo=UTC)


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "clock", lambda: NOW)


def rates(org: Org) -> None:
    rate_card_add(
        user=org.users["pat"],
        flavor=org.h100,
        valid_from=datetime(2020, 1, 1, tzinfo=UTC),
        prices=RatePrices(Decimal("2.50")),
    )


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def rows() -> list[int]:
    return [m.objects.count() for m in (Job, JobEvent, ApprovalRequest, AuditEntry)]


def test_the_form_has_a_quote_button_that_posts_with_htmx(org: Org, web_for: Any) -> None:
    html = web_for("alice").get(reverse("portal:job-new")).content.decode()
    button = re.search(r'<button[^>]*id="quote-button"[^>]*>', html, re.S)
    assert button is not None
    assert 'name="action"' in button.group(0) and 'value="quote"' in button.group(0)
    assert f'hx-post="{reverse("portal:job-new")}"' in button.group(0)
    assert 'hx-select="#job-form-body"' in button.group(0)


def february_budget(org: Org, limit: Decimal, policy: BudgetPolicy) -> None:
    """Team alpha's budget for February 2031, the month the quotes fall in."""
    Budget.objects.create(
        tenant=org.alpha, month=datetime(2031, 2, 1, tzinfo=UTC), limit=limit, policy=policy
    )


def quote(org: Org, web_for: Any, htmx: bool) -> Any:
    """Alice's 3-hour job quoted from the form (a plain post, or htmx's)."""
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    body = form_body(org, max_runtime_hours=3, action="quote")
    return web_for("alice").post(reverse("portal:job-new"), body, **headers)


@pytest.mark.parametrize("htmx", [False, True], ids=["plain-post", "htmx"])
def test_quote_shows_cost_approval_and_budget_and_submits_nothing(
    org: Org, web_for: Any, htmx: bool
) -> None:
    rates(org)
    policy_set(user=org.users["tina"], tenant=org.alpha, rule="gpus_over", threshold=4)
    february_budget(org, Decimal(1000), BudgetPolicy.NOTIFY)
    before = rows()
    response = quote(org, web_for, htmx)
    assert response.status_code == 200
    page = text(response.content.decode())
    # 2 replicas x 4 GPUs x 2.50 = 20.00 an hour; 3 hours = 60.00 on the only flavor, for
    # one attempt; the form's training default of one retry makes the worst case 2 x 60.00.
    assert "Nothing was submitted" in page
    assert re.search(r"[A-Z]{3} 60\.00 to [A-Z]{3} 120\.00", page), page
    assert "20.00 an hour" in page
    assert "2 attempts (retry limit 1 + 1) of up to 10800 s" in page
    assert "Approval needed" in page and "GPUs" in page
    # Budget left: 1000 - 0 before; 1000 - 120 after (the worst case is reserved).
    assert "1000.00 of 1000.00" in page and "880.00 after this job" in page
    assert rows() == before
    # The form keeps what was typed, so that Submit sends the same job.
    assert 'value="bert-pretrain"' in response.content.decode()


@pytest.mark.parametrize("htmx", [False, True], ids=["plain-post", "htmx"])
def test_a_quote_a_hard_budget_would_refuse_shows_the_quote_and_why_not_an_error(
    org: Org, web_for: Any, htmx: bool
) -> None:
    # was the submit's 409 shown as a form error ("Refused at submit: ..."), with no quote
    rates(org)
    february_budget(org, Decimal(5), BudgetPolicy.HARD)
    before = rows()
    response = quote(org, web_for, htmx)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="form-errors"' not in html and 'id="quote"' in html
    refused = re.search(r'<div[^>]*id="quote-refused"[^>]*>(.*?)</div>', html, re.S)
    assert refused is not None
    said = html_unescape(text(refused.group(1)))
    # 2 replicas x 4 GPUs x 2.50 x 3 h = 60.00 an attempt; the form's one retry: 120.00
    assert "A submit would be refused." in said
    assert "team-alpha's budget for 2031-02" in said and "is hard" in said
    assert "EUR 0.00 committed of EUR 5.00" in said and "up to EUR 120.00" in said
    page = text(html)
    assert re.search(r"[A-Z]{3} 60\.00 to [A-Z]{3} 120\.00", page), page  # the quote itself
    assert "Approval not judged" in page
    assert rows() == before


def test_a_quote_of_a_bad_form_or_a_foreign_project_shows_no_quote(org: Org, web_for: Any) -> None:
    before = rows()
    body = form_body(org, replicas=0, action="quote")
    client = web_for("alice")
    plain = client.post(reverse("portal:job-new"), body)
    assert plain.status_code == 400
    # HTMX swaps only 2xx answers: the errors come back in a 200 to be shown in the form.
    swapped = client.post(reverse("portal:job-new"), body, HTTP_HX_REQUEST="true")
    assert swapped.status_code == 200
    for response in (plain, swapped):
        html = response.content.decode()
        assert 'id="form-errors"' in html and 'id="quote"' not in html
    # Another team's project is not there, as for a submit.
    foreign = form_body(org, project=org.proj_bravo.pk, action="quote")
    assert client.post(reverse("portal:job-new"), foreign).status_code == 404
    assert rows() == before
