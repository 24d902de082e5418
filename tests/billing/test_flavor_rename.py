"""A renamed flavor keeps its costs: usage, closed lines and allocations keep the name of
their time, and billing follows the flavor (tenants.FormerFlavorName), not its name.

Before, renaming H100-80GB made every cost read and export a 400 ("no rate card of flavor
'H100-80GB'") for everyone until it was renamed back. The cluster is
tests/billing/test_statements.py's; hours 0-1 are closed, hours 2-3 open.
"""

from __future__ import annotations

from typing import Any

from billing.metering.hourly import meter_usage
from billing.statements.closing import statement_close
from scheduler.models import Node
from tenants.models import FormerFlavorName
from tests.billing.builders import T0, at, hold, job_for
from tests.billing.test_costs_api import WINDOW, costs
from tests.billing.test_statements import cluster
from tests.conftest import Org
from tests.factories import FlavorFactory


def _rename(client: Any, flavor_id: int, name: str) -> Any:
    return client.patch(f"/api/v1/flavors/{flavor_id}/", {"name": name}, format="json")


def test_costs_follow_a_renamed_flavor(org: Org, client_for: Any) -> None:
    cluster(org)
    statement_close(user=org.users["pat"], organisation=org.acme, start=T0, end=at(2), now=at(5))
    carol, pat = client_for("carol"), client_for("pat")
    before = costs(carol, by="flavor")
    assert {row["name"] for row in before["results"]} == {"H100-80GB"}

    assert _rename(pat, org.h100.pk, "H100-SXM").status_code == 200

    after = costs(carol, by="flavor")
    assert {row["name"]: row["charged"] for row in after["results"]} == {
        "H100-SXM": before["total"]["charged"]
    }
    assert after["total"] == before["total"]
    # Filters by the flavor find its lines, closed and open; its old name finds none.
    assert costs(carol, by="team", flavor="H100-SXM")["total"] == before["total"]
    assert costs(carol, by="team", flavor="H100-80GB")["total"]["charged"] == "0.00"
    for fmt in ("csv", "xlsx", "focus"):
        response = carol.get("/api/v1/costs/export/", {**WINDOW, "format": fmt, "by": "flavor"})
        assert response.status_code == 200, fmt
    csv = carol.get("/api/v1/costs/export/", {**WINDOW, "format": "csv", "by": "flavor"})
    text = b"".join(csv.streaming_content).decode("utf-8-sig")
    assert "H100-SXM" in text and "H100-80GB" not in text


def test_usage_recorded_under_the_old_name_is_billed_as_the_flavor(
    org: Org, client_for: Any
) -> None:
    """An hour metered after the rename, of an allocation that still carries the old name
    (nodes report the model name of their labels), is priced at the flavor's rate."""
    cluster(org)
    _rename(client_for("pat"), org.h100.pk, "H100-SXM")
    node = Node.objects.get(name="n1")
    hold(job_for(org), node, 4, 5, [1000], first_device=3)  # flavor "H100-80GB", 3.00
    assert meter_usage(now=at(6)) == 1
    body = costs(client_for("carol"), by="flavor", to="2031-02-01T01:00:00Z")
    assert [row["name"] for row in body["results"]] == ["H100-SXM"]


def test_a_former_name_stays_its_flavors(org: Org, client_for: Any) -> None:
    pat = client_for("pat")
    assert _rename(pat, org.h100.pk, "H100-SXM").status_code == 200
    assert list(FormerFlavorName.objects.values_list("name", "flavor")) == [
        ("H100-80GB", org.h100.pk)
    ]
    other = FlavorFactory(name="B200")
    refused = _rename(pat, other.pk, "H100-80GB")
    assert refused.status_code == 400 and "name" in str(refused.json())
    created = pat.post("/api/v1/flavors/", {"name": "H100-80GB", "memory_mib": 1}, format="json")
    assert created.status_code == 400
    # Renamed back: the name is current again, not a former one.
    assert _rename(pat, org.h100.pk, "H100-80GB").status_code == 200
    assert list(FormerFlavorName.objects.values_list("name", flat=True)) == ["H100-SXM"]
