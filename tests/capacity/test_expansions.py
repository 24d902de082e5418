"""Expansion what-ifs: the inventory changed and the demand scaled (whatif/inventory.py, pure),
the forecast's scale (capacity/expansions.py), and a run replayed end to end through the API:
more GPUs, shorter waits, a later saturation day."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.core.types import Device, JobRequest, Node, Resources
from scheduler.sim import WorkloadJob
from tests.capacity.builders import stored_run
from tests.whatif.builders import a_busy_past
from whatif import runs
from whatif.inventory import apply_inventory, scale_demand
from whatif.models import WhatIf, WhatIfState

URL = "/api/v1/capacity/expansions/"


def node(name: str, gpus: int = 8, flavor: str = "H100-80GB", pool: str = "a") -> Node:
    return Node(
        name, flavor, tuple(Device(i, 81920) for i in range(gpus)), 64_000, 512_000, pool=pool
    )


def sizes(nodes) -> list[tuple[str, str, int]]:
    return [(n.name, n.pool, len(n.devices)) for n in nodes]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"action": "add", "gpus": 12},
            [
                ("h-1", "a", 8),
                ("h-2", "a", 8),
                ("x-1", "a", 8),
                ("h-1+1", "a", 8),
                ("h-1+2", "a", 4),
            ],
        ),
        ({"action": "remove", "gpus": 10}, [("h-1", "a", 6), ("x-1", "a", 8)]),
        (
            {"action": "move", "gpus": 5, "from_pool": "a", "to_pool": "b"},
            [("h-1", "a", 8), ("h-2", "b", 8), ("x-1", "a", 8)],
        ),
    ],
    ids=["add-copies-the-first-node", "remove-from-the-last-whole-first", "move-whole-nodes"],
)
def test_the_inventory_changes(change, expected) -> None:
    nodes = (node("h-1"), node("h-2"), node("x-1", flavor="A100-40GB"))
    got = apply_inventory(nodes, [{"kind": "inventory", "flavor": "H100-80GB", **change}])
    assert sorted(sizes(got)) == sorted(expected)


def job(id_: str, flavors: tuple[str, ...] = ()) -> WorkloadJob:
    request = JobRequest(id_, "team-alpha", "normal", Resources(gpu_milli=1000), flavors=flavors)
    return WorkloadJob(request, arrival_s=100.0, duration_s=60.0)


def test_demand_is_scaled_on_the_model_and_on_any_model_only() -> None:
    jobs = [job("1", ("H100-80GB",)), job("2"), job("3", ("A100-40GB",))]
    got = scale_demand(jobs, [{"kind": "demand", "flavor": "H100-80GB", "scale": 3}])
    ids = sorted(w.request.id for w in got)
    assert ids == ["1", "1~1", "1~2", "2", "2~1", "2~2", "3"]
    assert all(100 <= w.arrival_s <= 3700 for w in got)
    halved = scale_demand(jobs * 20, [{"kind": "demand", "flavor": "H100-80GB", "scale": 0.5}])
    assert halved == scale_demand(
        jobs * 20, [{"kind": "demand", "flavor": "H100-80GB", "scale": 0.5}]
    )
    assert 20 < len(halved) < 60  # 20 A100 jobs kept, about half of the 40 others


@pytest.mark.django_db
def test_an_admin_replays_eight_more_gpus_against_the_forecast_demand(org, client_for) -> None:
    now = timezone.now()
    a_busy_past(org, now - timedelta(hours=1))
    stored_run(org)
    response = client_for("pat").post(
        URL,
        {"flavor": "H100-80GB", "action": "add", "gpus": 8, "window_days": 1},
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    # The forecast's p50 on day 90 (the one-day window ending there): 60 + 1.75 x (28 + 89)
    # = 264.75 GPU-hours, against the last day's 60 + 1.75 x 27 = 107.25: 2.47 times the jobs.
    assert body["demand_scale"] == pytest.approx(264.75 / 107.25, rel=1e-3)
    assert body["saturation"]["p50_day"] != "2026-12-16"  # 16 GPUs: later than with 8
    run = WhatIf.objects.get(pk=body["whatif"])
    assert [c["kind"] for c in run.changes] == ["demand", "inventory"]
    assert runs.whatif_run(run.pk, clock=timezone.now)
    run.refresh_from_db()
    assert run.state == WhatIfState.DONE, run.error
    base, proposed = run.results["baseline"], run.results["proposed"]
    assert (base["capacity_gpus"], proposed["capacity_gpus"]) == (8, 16)
    # The window's 4 real jobs, each replayed 2 or 3 times (2.47 on average; seeded draws).
    assert run.results["jobs_found"] == 4 and 8 <= run.results["jobs_replayed"] <= 12
    waits = {
        side: sum(sum(t["waits"]) for t in run.results[side]["tenants"].values())
        for side in ("baseline", "proposed")
    }
    assert waits["proposed"] < waits["baseline"]
    detail = client_for("carol").get(f"/api/v1/what-ifs/{run.pk}/").json()
    assert detail["results"]["totals"]["proposed"]["capacity_gpus"] == 16


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "move", "gpus": 8, "from_pool": "default"}, "to_pool"),
        ({"action": "add", "gpus": 8, "to_pool": "b"}, "to_pool"),
        ({"action": "remove", "gpus": 9}, "gpus"),
        ({"action": "add", "gpus": 0}, "gpus"),
        ({"action": "add", "gpus": 8, "at_day": 200}, "at_day"),
        ({"action": "add", "gpus": 8, "flavor": "B200"}, "flavor"),
        ({"action": "grow", "gpus": 8}, "action"),
    ],
    ids=[
        "move-one-pool",
        "add-names-a-pool",
        "remove-too-many",
        "zero",
        "past-the-forecast",
        "unknown-model",
        "unknown-action",
    ],
)
def test_bad_expansions_are_400_naming_the_field_and_start_nothing(
    org, client_for, body, field
) -> None:
    a_busy_past(org, timezone.now())
    stored_run(org)
    response = client_for("pat").post(URL, {"flavor": "H100-80GB", **body}, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"], response.json()
    assert not WhatIf.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["carol", "dana", "alice"])
def test_only_platform_admins_start_expansions(org, client_for, persona) -> None:
    stored_run(org)
    body = {"flavor": "H100-80GB", "action": "add", "gpus": 8}
    assert client_for(persona).post(URL, body, format="json").status_code == 403
    assert not WhatIf.objects.exists()
