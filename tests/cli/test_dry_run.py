"""`gantry submit --dry-run`: the quote printed, nothing created (issue 18)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from billing.budgets import checks as admission
from billing.models import Budget, BudgetPolicy
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.models import Job, JobEvent
from tenants.approval_policies import policy_set
from tenants.models import ApprovalRequest, AuditEntry
from tests.cli.test_cli import gantry, logged_in  # noqa: F401  (fixtures)
from tests.conftest import Org, job_spec

pytestmark = pytest.mark.django_db(transaction=True)


def created() -> list[int]:
    return [m.objects.count() for m in (Job, JobEvent, ApprovalRequest, AuditEntry)]


def spec_file(tmp_path: Path, **overrides: Any) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_spec(name="cli-quote", **overrides)))
    return str(path)


def h100_at_2_50(org: Org) -> None:
    """H100 at 2.50 a GPU-hour since 2020."""
    rate_card_add(
        user=org.users["pat"],
        flavor=org.h100,
        valid_from=datetime(2020, 1, 1, tzinfo=UTC),
        prices=RatePrices(Decimal("2.50")),
    )


def test_dry_run_prints_the_quote_and_creates_nothing(
    logged_in: Any,  # noqa: F811
    org: Org,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "clock", lambda: datetime(2031, 2, 10, 12, tzinfo=UTC))
    Budget.objects.create(
        tenant=org.alpha, month=datetime(2031, 2, 1, tzinfo=UTC), limit=Decimal("100.00")
    )
    # H100 at 2.50 a GPU-hour: 2 replicas x 4 GPUs x 2.50 = 20.00 an hour, 3 hours = 60.00.
    h100_at_2_50(org)
    policy_set(user=org.users["tina"], tenant=org.alpha, rule="gpus_over", threshold=4)
    before = created()
    path = spec_file(tmp_path, max_runtime_s=3 * 3600)
    code, out, err = logged_in("submit", path, "--project", "proj-alpha", "--dry-run")
    assert code == 0, err
    assert "nothing was submitted" in out
    assert "60.00" in out and "20.00" in out
    assert "approval: needed" in out and "GPUs" in out
    assert re.search(r"budget: 100\.00 [A-Z]{3} left of 100\.00", out), out
    assert "budget used: 0.0 %" in out
    assert re.search(r"after the job: 40\.00 [A-Z]{3} left", out), out  # 100.00 - 60.00
    code, out, err = logged_in("--json", "submit", path, "--project", "proj-alpha", "--dry-run")
    assert code == 0, err
    body = json.loads(out)
    assert (body["estimate"]["low"], body["estimate"]["high"]) == ("60.00", "60.00")
    assert body["approval"]["needed"] is True
    assert created() == before


def test_dry_run_a_hard_budget_would_refuse_prints_the_quote_and_why_and_exits_4(
    logged_in: Any,  # noqa: F811
    org: Org,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # was "HTTP 409: Refused at submit: ..." and exit 1, with no quote
    monkeypatch.setattr(admission, "clock", lambda: datetime(2031, 2, 10, 12, tzinfo=UTC))
    Budget.objects.create(
        tenant=org.alpha,
        month=datetime(2031, 2, 1, tzinfo=UTC),
        limit=Decimal("5.00"),
        policy=BudgetPolicy.HARD,
    )
    h100_at_2_50(org)
    before = created()
    path = spec_file(tmp_path, max_runtime_s=3 * 3600)  # 60.00 at worst, over the 5.00
    code, out, err = logged_in("submit", path, "--project", "proj-alpha", "--dry-run")
    assert code == 4, err
    assert "HTTP" not in out + err
    assert "nothing was submitted" in out and "60.00" in out  # the quote's figures
    assert "submit: would be REFUSED" in out
    said = " ".join(out.split())  # the reason, wrapped over lines
    assert "team-alpha's budget for 2031-02" in said and "is hard" in said
    assert "EUR 0.00 committed of EUR 5.00" in said
    assert "may cost up to" in said and "60.00 (its worst case)" in said
    assert "a submit would be refused" in err
    code, out, _ = logged_in("--json", "submit", path, "--project", "proj-alpha", "--dry-run")
    assert code == 4
    body = json.loads(out)
    assert body["refused"]["budget"]["limit"] == "5.00" and body["estimate"]["high"] == "60.00"
    assert created() == before


def test_dry_run_of_a_bad_spec_prints_the_field_errors(
    logged_in: Any,  # noqa: F811
    org: Org,
    tmp_path: Path,
) -> None:
    before = created()
    path = spec_file(tmp_path, replicas=0)
    code, _, err = logged_in("submit", path, "--project", "proj-alpha", "--dry-run")
    assert code == 1
    assert "HTTP 400" in err and "spec.replicas" in err
    code, _, err = logged_in("submit", path, "--project", str(org.proj_bravo.pk), "--dry-run")
    assert code == 1 and "HTTP 404" in err
    assert created() == before
