"""The costs page's exports: start one, watch its progress, download it; only yours.

The cluster is tests/billing/test_statements.py's, metered over [T0, at(4)) in 2031-01.
"""

from __future__ import annotations

import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from billing.exports import formats as exports
from billing.exports import runs as export_runs
from billing.models import CostExport
from tests.billing.test_exports import eager_celery  # noqa: F401 - a fixture
from tests.billing.test_statements import cluster
from tests.conftest import Org

FORM = {"format": "xlsx", "from": "2031-01-31", "to": "2031-02-01", "by": "team"}


@pytest.fixture(autouse=True)
def _export_dir(settings: Any, tmp_path: Path) -> None:
    settings.GANTRY_EXPORT_DIR = tmp_path / "exports"


def web(org: Org, username: str) -> Client:
    client = Client()
    client.force_login(org.users[username])
    return client


def test_the_costs_page_offers_an_export_of_its_month(org: Org) -> None:
    html = web(org, "carol").get(reverse("portal:costs"), {"month": "2031-01"}).content.decode()
    section = html.split('id="cost-exports"')[1]
    assert 'name="from" value="2031-01-01"' in section
    assert 'name="to" value="2031-02-01"' in section
    assert reverse("portal:cost-export-new") in section
    assert "No exports yet." in section


@pytest.mark.usefixtures("eager_celery")
def test_finance_exports_xlsx_follows_it_and_downloads_it(
    org: Org, client_for: Any, django_capture_on_commit_callbacks: Any
) -> None:
    cluster(org)
    client = web(org, "carol")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("portal:cost-export-new"), FORM)
    assert response.status_code == 302
    assert response["Location"].endswith("#cost-exports")
    export = CostExport.objects.get(owner=org.users["carol"])
    assert export.state == "done" and export.progress_done == export.progress_total == 3
    row = client.get(reverse("portal:cost-export-status", args=[export.pk]))
    html = row.content.decode()
    assert "hx-trigger" not in html  # finished: no more polling
    link = reverse("portal:cost-export-download", args=[export.pk])
    assert link in html and 'value="3" max="3"' in html
    page = client.get(reverse("portal:costs"), {"month": "2031-01"}).content.decode()
    assert f'id="cost-export-{export.pk}"' in page and link in page
    data = b"".join(client.get(link).streaming_content)
    sheet = openpyxl.load_workbook(io.BytesIO(data)).active
    api = client_for("carol").get(
        "/api/v1/costs/", {"from": "2031-01-31", "to": "2031-02-01", "by": "team"}
    )
    last = list(sheet.iter_rows(values_only=True))[-1]
    assert last[3] == "Total" and last[4] is None  # the cluster column, empty on the totals
    assert Decimal(str(last[5])) == Decimal(api.json()["total"]["charged"])


def test_a_running_export_is_polled_with_its_progress(org: Org) -> None:
    query = exports.query_from_json(
        {"from": "2031-01-31T00:00:00Z", "to": "2031-02-01T00:00:00Z", "by": "team"}
    )
    export = export_runs.cost_export_start(
        user=org.users["tina"], fmt="csv", query=query, now=timezone.now()
    )
    CostExport.objects.filter(pk=export.pk).update(
        state="running", progress_done=500, progress_total=2000
    )
    html = web(org, "tina").get(reverse("portal:cost-export-status", args=[export.pk]))
    text = html.content.decode()
    assert 'hx-trigger="every 2s"' in text and 'value="500" max="2000"' in text
    assert "500 of 2000 rows" in text and "download" not in text.lower().split("</progress>")[1]


def test_a_bad_window_is_a_400_that_says_which_field(org: Org) -> None:
    response = web(org, "carol").post(
        reverse("portal:cost-export-new"), {**FORM, "to": "2030-01-01"}
    )
    assert response.status_code == 400
    assert "to: must be after from." in response.content.decode()
    assert not CostExport.objects.exists()


def test_members_may_not_export_from_the_portal(org: Org) -> None:
    response = web(org, "alice").post(reverse("portal:cost-export-new"), FORM)
    assert response.status_code == 403
    assert not CostExport.objects.exists()


def test_anothers_export_is_a_404_in_the_portal(org: Org) -> None:
    query = exports.query_from_json(
        {"from": "2031-01-31T00:00:00Z", "to": "2031-02-01T00:00:00Z", "by": "team"}
    )
    export = export_runs.cost_export_start(
        user=org.users["carol"], fmt="csv", query=query, now=timezone.now()
    )
    export_runs.cost_export_run(export.pk, clock=timezone.now)
    for persona in ["pat", "tina"]:
        client = web(org, persona)
        for name in ["portal:cost-export-status", "portal:cost-export-download"]:
            assert client.get(reverse(name, args=[export.pk])).status_code == 404, persona
        page = client.get(reverse("portal:costs"), {"month": "2031-01"}).content.decode()
        assert f'id="cost-export-{export.pk}"' not in page
    owner = web(org, "carol")
    response = owner.get(reverse("portal:cost-export-download", args=[export.pk]))
    assert response.status_code == 200
    assert b"".join(response.streaming_content).decode("utf-8-sig").startswith("from,to,team_id")
