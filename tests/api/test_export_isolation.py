"""Every export, opened and read as each persona of the isolation walks: never another tenant's row.

The walks (tests/api/test_isolation_walk.py, tests/portal/test_isolation_walk.py) check that a
foreign export or download is a 404 and that no page spells the foreign marker, but an XLSX is
a zip: its text is compressed, so a search of the bytes finds nothing either way. Here each file
is opened (csv, openpyxl) and its cells read: the cost file at once (`GET /costs/export/`) and
the Celery one (`POST /cost-exports/`, then its download) in every format and aggregation, and
the portal's export for those who may start one. Each persona's own rows are there, so the
check cannot pass on an empty file.
"""

from __future__ import annotations

import io
from typing import Any

import openpyxl
import pytest
from django.test import Client
from django.urls import reverse

from billing.models import CostExport, ExportState
from tests.api.test_isolation_walk import (
    MARKERS,
    NEVER_SEEN,
    PERSONAS,
    populate,
    populate_billing,
    text_of,
    walk_client,
)
from tests.billing.test_exports import eager_celery  # noqa: F401 - a fixture
from tests.conftest import Org
from tests.isolation_personas import add_personas

WINDOW = {"from": "2031-01-31T20:00:00Z", "to": "2031-02-01T00:00:00Z"}
FORMATS = ["csv", "xlsx", "focus"]
# What each persona's exports must show of their own (none: no usage in their view): the team
# of the metered job they see and the user who ran it.
OWN = {
    "alice": ("alpha", "alice"),
    "alice+token": ("alpha", "alice"),
    "april": ("alpha", "alice"),
    "bob-bravo": ("bravo", "bob-bravo"),
    "tina": ("alpha", "alice"),
    "dana": ("alpha", "alice"),
    "chris": ("charlie", "chris"),
}
# Who may start an export in the portal (finance, platform and tenant admins).
PORTAL_EXPORTERS = {"tina", "dana"}


def cells(response: Any, fmt: str) -> str:
    """The file's text: every cell of an XLSX, the decoded text of a CSV."""
    data = b"".join(response.streaming_content)
    if fmt != "xlsx":
        return data.decode("utf-8-sig")
    book = openpyxl.load_workbook(io.BytesIO(data), read_only=True)
    return "\n".join(
        ",".join("" if v is None else str(v) for v in row)
        for sheet in book.worksheets
        for row in sheet.iter_rows(values_only=True)
    )


def check(persona: str, text: str, where: str, by: str) -> None:
    never = NEVER_SEEN.get(persona, (MARKERS[PERSONAS[persona]],))
    assert not [m for m in never if m in text], (persona, where, text[:500])
    if persona in OWN:
        team, user = OWN[persona]
        own = user if by == "user" else team
        assert own in text, (persona, where, text[:500])  # their own rows are there


@pytest.fixture
def billed(org: Org) -> Org:
    add_personas(org)
    populate(org)
    populate_billing(org)
    return org


@pytest.mark.usefixtures("eager_celery")
@pytest.mark.parametrize("persona", sorted(PERSONAS))
def test_every_export_holds_only_what_the_persona_may_see(
    billed: Org, client_for: Any, django_capture_on_commit_callbacks: Any, persona: str
) -> None:
    client = walk_client(billed, client_for, persona)
    foreign = getattr(billed, PERSONAS[persona])
    # The walk's organisation holds a queued export of each team's member; one export runs at a
    # time per person (billing/exports/runs.py), so those end before this persona starts its own.
    CostExport.objects.filter(state=ExportState.QUEUED).update(state=ExportState.FAILED)
    for fmt in FORMATS:
        for by in ["user", "team", "project"]:
            query = {**WINDOW, "by": by, "format": fmt}
            response = client.get("/api/v1/costs/export/", query)
            assert response.status_code == 200, (persona, query, response.content[:300])
            check(persona, cells(response, fmt), f"costs/export {fmt} by {by}", by)
            refused = client.get("/api/v1/costs/export/", {**query, "tenant": foreign.pk})
            assert refused.status_code == 404, (persona, query)
        with django_capture_on_commit_callbacks(execute=True):  # the task is queued on commit
            started = client.post("/api/v1/cost-exports/", {**WINDOW, "format": fmt}, format="json")
        assert started.status_code == 201, (persona, started.json())
        download = client.get(f"/api/v1/cost-exports/{started.json()['id']}/download/")
        assert download.status_code == 200, (persona, fmt, download.content[:300])
        check(persona, cells(download, fmt), f"cost-exports {fmt}", "team")
        aimed = {**WINDOW, "format": fmt, "tenant": foreign.pk}
        assert client.post("/api/v1/cost-exports/", aimed, format="json").status_code == 404


@pytest.mark.usefixtures("eager_celery")
@pytest.mark.parametrize("persona", sorted(p for p in PERSONAS if "+" not in p))
def test_the_portal_export_holds_only_what_the_persona_may_see(
    billed: Org, django_capture_on_commit_callbacks: Any, persona: str
) -> None:
    client = Client()
    client.force_login(billed.users[persona])
    form = {"format": "xlsx", "from": "2031-01-31", "to": "2031-02-01", "by": "team"}
    before = set(CostExport.objects.values_list("pk", flat=True))
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("portal:cost-export-new"), form)
    new = CostExport.objects.exclude(pk__in=before)
    if persona not in PORTAL_EXPORTERS:
        assert response.status_code == 403, (persona, response.status_code)
        assert not new.exists()
        return
    assert response.status_code == 302, (persona, response.status_code)
    download = client.get(reverse("portal:cost-export-download", args=[new.get().pk]))
    assert download.status_code == 200
    check(persona, cells(download, "xlsx"), "portal export", "team")


# The audit log is the admins' (each reads their subtrees'): the portal refuses anyone else
# (403), the API gives them a file with the header alone.
AUDIT_ADMINS = {"tina": "proj-alpha", "dana": "proj-bravo"}


@pytest.mark.parametrize("persona", sorted(p for p in PERSONAS if "+" not in p))
def test_the_audit_exports_hold_only_what_the_persona_may_see(
    billed: Org, client_for: Any, persona: str
) -> None:
    """The audit log as CSV, unfiltered, from the portal and the API."""
    portal = Client()
    portal.force_login(billed.users[persona])
    never = NEVER_SEEN.get(persona, (MARKERS[PERSONAS[persona]],))
    for where, response in [
        ("portal", portal.get(reverse("portal:audit-export"))),
        ("api", client_for(persona).get("/api/v1/audit/export.csv")),
    ]:
        if persona not in AUDIT_ADMINS and where == "portal":
            assert response.status_code == 403, (persona, response.status_code)
            continue
        assert response.status_code == 200, (persona, where, response.status_code)
        text = text_of(response).removeprefix("\ufeff")
        assert not [m for m in never if m in text], (persona, where, text[:500])
        rows = text.strip().splitlines()
        if persona in AUDIT_ADMINS:
            assert AUDIT_ADMINS[persona] in text, (persona, where, text[:500])
        else:
            assert len(rows) == 1, (persona, where, rows)  # the header alone
