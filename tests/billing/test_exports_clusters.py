"""Every grouping of the costs CSV and XLSX carries the cluster (issue 38): a row per group and
cluster, beside `by` (team, project, user, flavor ...), not only `by=cluster`; FOCUS is as it
was (`x_ClusterName` per line).

The installation of tests/billing/test_rates_per_cluster.py: the home cluster (its own card,
3.00 a GPU-hour), site-b (5.00) and site-c (the default card, 2.00); one job of team-alpha on
each, one device for hour 0, metered.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import openpyxl
import pytest

from tests.billing.test_rates_per_cluster import EXPORT, WINDOW, installation
from tests.conftest import Org


def download(client: Any, fmt: str, **params: Any) -> bytes:
    response = client.get(EXPORT, {**WINDOW, "format": fmt, "kind": "used", **params})
    assert response.status_code == 200, response.content[:500]
    return b"".join(response.streaming_content)


def table(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8-sig"))))


@pytest.mark.parametrize(
    ("by", "group"),
    [("team", "team-alpha"), ("project", "proj-alpha"), ("user", "alice"), ("flavor", "H100-80GB")],
)
def test_a_csv_row_per_group_and_cluster(org: Org, client_for: Any, by: str, group: str) -> None:
    clusters = installation(org)
    home = clusters["home"].name
    *rows, total = table(download(client_for("carol"), "csv", by=by))
    # team-alpha's one job per cluster, priced by each cluster's card: 3 + 5 + 2 = 10
    assert sorted((r[by], r["cluster"], r["charged_EUR"]) for r in rows) == sorted(
        [(group, home, "3.00"), (group, "site-b", "5.00"), (group, "site-c", "2.00")]
    )
    assert (total[by], total["cluster"], total["charged_EUR"]) == ("Total", "", "10.00")


def test_an_xlsx_row_per_group_and_cluster(org: Org, client_for: Any) -> None:
    clusters = installation(org)
    data = download(client_for("carol"), "xlsx", by="team")
    sheet = openpyxl.load_workbook(io.BytesIO(data)).active
    header, *rows, _total = list(sheet.iter_rows(values_only=True))
    assert header[3:6] == ("team", "cluster", "Charged")
    assert sorted((r[3], r[4], float(r[5])) for r in rows) == sorted(
        [
            ("team-alpha", clusters["home"].name, 3.0),
            ("team-alpha", "site-b", 5.0),
            ("team-alpha", "site-c", 2.0),
        ]
    )


def test_by_cluster_keeps_one_cluster_column_and_focus_is_unchanged(
    org: Org, client_for: Any
) -> None:
    installation(org)
    client = client_for("carol")
    header = next(
        csv.reader(io.StringIO(download(client, "csv", by="cluster").decode("utf-8-sig")))
    )
    assert header[:5] == ["from", "to", "cluster_id", "cluster", "charged_EUR"]
    focus = next(csv.reader(io.StringIO(download(client, "focus").decode())))
    assert "cluster" not in focus and "x_ClusterName" in focus
