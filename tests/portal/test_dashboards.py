"""The portal's dashboards (issue 20): the cluster's for platform admins and finance, a
tenant's for whoever sees the tenant, a job's utilization on its page. Each persona sees its
own and nothing of another team's; a bad range is a 400 that names it; no data says so; each
view's query count is pinned."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from scheduler.models import Allocation, GpuDevice, JobEvent, JobState
from scheduler.telemetry.dashboards import cluster_dashboard, tenant_dashboard, window_for
from scheduler.telemetry.job_dashboard import job_utilization
from scheduler.telemetry.queue_history import queue_snapshot_take
from scheduler.telemetry.rollups import floor_to, rollup_run
from scheduler.telemetry.samples import DeviceReading, samples_ingest
from tests.billing.builders import hold, job_for, make_node
from tests.class_data import built_for_the_class, copied
from tests.conftest import Org, build_org

pytestmark = pytest.mark.django_db

EMPTY = "No utilization data yet for this range."


def build_history(org: Org) -> dict[str, Any]:
    """The last two hours: team-alpha's job at 80 % on one H100, team-bravo's idle at 1 %
    on the other, rolled up; a queue snapshot per 5 minutes; a failure of each team."""
    now = timezone.now()
    start = floor_to(now, timedelta(hours=1)) - timedelta(hours=2)
    node = make_node("n1", gpus=2)
    alpha = job_for(org, state=JobState.RUNNING, name="train-alpha", started_at=start)
    bravo = job_for(
        org, "bob-bravo", project=org.proj_bravo, state=JobState.RUNNING, name="idle-bravo"
    )
    hold(alpha, node, -3, None, [1000])
    hold(bravo, node, -3, None, [1000], first_device=1)
    # Held from the history's start (the job's page reads each device within its allocation).
    Allocation.objects.filter(job__in=[alpha, bravo]).update(started_at=start)
    d0, d1 = GpuDevice.objects.filter(node=node).order_by("index")
    for i in range(0, 2 * 3600, 30):
        samples_ingest(
            [DeviceReading(d0.id, 80.0, memory_used_mib=9000), DeviceReading(d1.id, 1.0)],
            at=start + timedelta(seconds=i),
        )
    while rollup_run(now=start + timedelta(hours=2, minutes=2)):
        pass
    for minutes in range(0, 120, 5):
        queue_snapshot_take(now=start + timedelta(minutes=minutes + 6))
    for job, reason in [(alpha, "OOMKilled"), (bravo, "ImagePullBackOff")]:
        JobEvent.objects.create(job=job, kind="attempt_failed", data={"reason": reason})
    JobEvent.objects.filter(kind="attempt_failed").update(at=start + timedelta(minutes=30))
    return {"alpha": alpha, "bravo": bravo, "start": start}


def figures(html: str) -> dict[str, Any]:
    found = re.findall(
        r'<script id="(figure-[a-z-]+)" type="application/json">(.*?)</script>', html
    )
    return {name: json.loads(body) for name, body in found}


# Session and user (2), the grants (2), then the view's own reads.
CLUSTER_QUERIES = 4 + 8
TENANT_QUERIES = 4 + 1 + 6


@pytest.fixture(scope="class")
def built_history(
    django_db_setup: None, django_db_blocker: Any
) -> Iterator[tuple[Org, dict[str, Any]]]:
    """The organisation and its history, built once for TestWithTheHistory."""

    def build() -> tuple[Org, dict[str, Any]]:
        org = build_org()
        return org, build_history(org)

    yield from built_for_the_class(django_db_blocker, build)


class TestWithTheHistory:
    """The dashboards over two hours of history, built once for the class (tests/class_data.py:
    each test rolls back its own writes and gets its own copy of the objects)."""

    @pytest.fixture
    def org(self, built_history: tuple[Org, dict[str, Any]], db: None) -> Org:
        return copied(built_history[0])

    @pytest.fixture
    def history(self, built_history: tuple[Org, dict[str, Any]], db: None) -> dict[str, Any]:
        return copied(built_history[1])

    @pytest.mark.parametrize("persona", ["pat", "carol"])
    def test_platform_admins_and_finance_see_the_cluster_dashboard(
        self, persona: str, history: dict[str, Any], web_for: Any
    ) -> None:
        response = web_for(persona).get(reverse("portal:dashboard-cluster"))
        assert response.status_code == 200
        html = response.content.decode()
        drawn = figures(html)
        assert {
            "figure-capacity",
            "figure-queue",
            "figure-fragmentation",
            "figure-failures",
        } <= set(drawn)
        names = {trace["name"] for trace in drawn["figure-capacity"]["data"]}
        assert names == {"H100-80GB allocated", "H100-80GB used"}
        # Both GPUs held all the time; used (80 + 1) / 2 % of 2 devices = 0.81 GPU.
        assert set(drawn["figure-capacity"]["data"][0]["y"]) == {2.0}
        assert "OOMKilled" in html and "ImagePullBackOff" in html
        assert "idle-bravo" in html  # the top idle allocation, with its table
        assert EMPTY not in html

    @pytest.mark.parametrize("persona", ["alice", "tina", "dana", "bob-bravo", "chris"])
    def test_anyone_else_gets_a_404_for_the_cluster_dashboard(
        self, persona: str, history: dict[str, Any], web_for: Any
    ) -> None:
        response = web_for(persona).get(reverse("portal:dashboard-cluster"))
        assert response.status_code == 404
        assert "idle-bravo" not in response.content.decode()

    @pytest.mark.parametrize(
        ("persona", "tenant", "status"),
        [
            ("alice", "alpha", 200),  # member
            ("tina", "alpha", 200),  # tenant admin
            ("dana", "alpha", 200),  # admin of the department above
            ("pat", "alpha", 200),
            ("carol", "alpha", 200),
            ("bob-bravo", "alpha", 404),  # another team
            ("chris", "alpha", 404),
            ("alice", "bravo", 404),
            ("tina", "bravo", 404),
        ],
    )
    def test_the_tenant_dashboard_for_each_persona(
        self,
        persona: str,
        tenant: str,
        status: int,
        org: Org,
        history: dict[str, Any],
        web_for: Any,
    ) -> None:
        target = getattr(org, tenant)
        response = web_for(persona).get(
            reverse("portal:tenant-dashboard", kwargs={"pk": target.pk})
        )
        assert response.status_code == status
        html = response.content.decode()
        assert "idle-bravo" not in html and "ImagePullBackOff" not in html
        if status == 200:
            drawn = figures(html)
            names = {trace["name"] for trace in drawn["figure-usage"]["data"]}
            assert names == {"H100-80GB used", "H100-80GB guarantee", "H100-80GB limit"}
            # team-alpha's one GPU, against its 16 guaranteed: 15 lent, none borrowed.
            assert set(drawn["figure-usage"]["data"][0]["y"]) == {1.0}
            assert "team-bravo" not in html

    def test_the_departments_dashboard_adds_up_its_teams(
        self, org: Org, history: dict[str, Any], web_for: Any
    ) -> None:
        url = reverse("portal:tenant-dashboard", kwargs={"pk": org.research.pk})
        drawn = figures(web_for("dana").get(url).content.decode())
        assert set(drawn["figure-usage"]["data"][0]["y"]) == {2.0}  # alpha's GPU and bravo's

    def test_the_tenant_dashboards_data_has_nothing_of_another_team(
        self, org: Org, history: dict[str, Any]
    ) -> None:
        window = window_for("24h", timezone.now())
        alpha = tenant_dashboard(org.alpha, window)
        assert [row.name for row in alpha.idle_jobs] == []  # no idle scan ran: nothing kept
        assert {p.admissions for p in alpha.queue} <= {0}
        bravo = tenant_dashboard(org.bravo, window)
        assert bravo.usage["H100-80GB"][0].used == 1.0
        # bravo's 1 % GPU is idle the whole time: one idle GPU per window.
        assert {round(idle, 6) for _, _, idle in bravo.idle} == {1.0}
        assert {round(idle, 6) for _, _, idle in alpha.idle} == {0.0}
        cluster = cluster_dashboard(window)
        assert [row.name for row in cluster.idle] == ["idle-bravo"]

    @pytest.mark.parametrize("url_name", ["dashboard-cluster", "tenant-dashboard"])
    def test_a_bad_range_is_a_400_that_names_it(
        self, url_name: str, org: Org, history: dict[str, Any], web_for: Any
    ) -> None:
        kwargs = {"pk": org.alpha.pk} if url_name == "tenant-dashboard" else None
        url = reverse(f"portal:{url_name}", kwargs=kwargs)
        response = web_for("pat").get(url, {"range": "1y"})
        assert response.status_code == 400
        html = response.content.decode()
        assert "&#x27;1y&#x27; is not a range" in html and "6h, 24h, 7d, 30d" in html
        assert 'id="range-form"' in html  # the picker is there to choose again

    @pytest.mark.parametrize("key", ["6h", "24h", "7d", "30d"])
    def test_each_range_draws_the_history(
        self, key: str, history: dict[str, Any], web_for: Any
    ) -> None:
        response = web_for("pat").get(reverse("portal:dashboard-cluster"), {"range": key})
        assert response.status_code == 200
        assert "figure-capacity" in figures(response.content.decode())

    def test_the_job_page_shows_its_utilization(
        self, history: dict[str, Any], web_for: Any
    ) -> None:
        url = reverse("portal:job-detail", kwargs={"pk": history["alpha"].pk})
        html = web_for("alice").get(url).content.decode()
        drawn = figures(html)["figure-job-utilization"]
        # One line per device it held (n1's GPU 0), none of team-bravo's GPU 1 beside it.
        assert [t["name"] for t in drawn["data"]] == ["n1 / GPU 0 %", "n1 / GPU 0 MiB"]
        assert set(drawn["data"][0]["y"]) == {80.0} and set(drawn["data"][1]["y"]) == {9000.0}
        table = html.split('id="table-job-utilization"')[1].split("</table>")[0]
        assert "n1 / GPU 0" in table and "9000" in table and "GPU 1" not in table

    def test_the_cluster_dashboard_reads_a_fixed_number_of_queries(
        self, history: dict[str, Any], web_for: Any, django_assert_num_queries: Any
    ) -> None:
        client = web_for("pat")
        for key in ("6h", "30d"):
            with django_assert_num_queries(CLUSTER_QUERIES):
                assert (
                    client.get(reverse("portal:dashboard-cluster"), {"range": key}).status_code
                    == 200
                )

    def test_the_tenant_dashboard_reads_a_fixed_number_of_queries(
        self, org: Org, history: dict[str, Any], web_for: Any, django_assert_num_queries: Any
    ) -> None:
        client = web_for("dana")
        for tenant in (org.alpha, org.research):
            url = reverse("portal:tenant-dashboard", kwargs={"pk": tenant.pk})
            with django_assert_num_queries(TENANT_QUERIES):
                assert client.get(url, {"range": "7d"}).status_code == 200


def test_dashboards_without_data_say_so_instead_of_empty_axes(org: Org, web_for: Any) -> None:
    html = web_for("pat").get(reverse("portal:dashboard-cluster")).content.decode()
    assert figures(html) == {}
    assert html.count(EMPTY) >= 3 and 'id="dashboard-empty"' in html
    url = reverse("portal:tenant-dashboard", kwargs={"pk": org.alpha.pk})
    html = web_for("alice").get(url).content.decode()
    assert figures(html) == {} and 'id="dashboard-empty"' in html


def test_the_job_page_draws_a_shared_gpu_with_its_share(org: Org, web_for: Any) -> None:
    now = timezone.now()
    start = floor_to(now, timedelta(hours=1)) - timedelta(hours=1)
    node = make_node("n1", gpus=1)
    job = job_for(org, state=JobState.RUNNING, name="notebook", started_at=start)
    hold(job, node, -3, None, [250])
    Allocation.objects.filter(job=job).update(started_at=start)
    device = GpuDevice.objects.get(node=node)
    for i in range(0, 3600, 30):
        samples_ingest([DeviceReading(device.id, 30.0)], at=start + timedelta(seconds=i))
    while rollup_run(now=start + timedelta(hours=1, minutes=2)):
        pass
    url = reverse("portal:job-detail", kwargs={"pk": job.pk})
    drawn = figures(web_for("alice").get(url).content.decode())["figure-job-utilization"]
    assert drawn["data"][0]["name"] == "n1 / GPU 0 (0.25 GPU) %"


def test_the_job_utilization_reads_two_queries_however_many_devices(
    org: Org, django_assert_num_queries: Any
) -> None:
    start = floor_to(timezone.now(), timedelta(hours=1)) - timedelta(hours=1)
    job = job_for(org, state=JobState.RUNNING, name="gang", started_at=start)
    for number in range(4):  # 4 nodes x 8 GPUs, two attempts on each
        node = make_node(f"n{number}", gpus=8)
        hold(job, node, -3, -2, [1000] * 8, replica=number, attempt=0)
        hold(job, node, -2, None, [1000] * 8, replica=number, attempt=1)
        Allocation.objects.filter(job=job, node=node).update(started_at=start)
        samples_ingest(
            [DeviceReading(d.id, 50.0) for d in GpuDevice.objects.filter(node=node)], at=start
        )
    while rollup_run(now=start + timedelta(minutes=7)):
        pass
    # The devices and shares it held, then their roll-ups.
    with django_assert_num_queries(2):
        util = job_utilization(job, timezone.now())
    assert len(util.devices) == 32 and util.devices_held == 32


def test_a_job_without_samples_says_so(org: Org, web_for: Any) -> None:
    job = job_for(org, state=JobState.QUEUED)
    html = web_for("alice").get(reverse("portal:job-detail", kwargs={"pk": job.pk})).content
    assert b"No utilization data yet for this job." in html
    assert b"figure-job-utilization" not in html


def test_the_nav_links_the_dashboards_only_for_those_who_may_see_them(
    org: Org, web_for: Any
) -> None:
    cluster = reverse("portal:dashboard-cluster")
    for persona, sees in [("pat", True), ("carol", True), ("tina", False), ("alice", False)]:
        html = web_for(persona).get(reverse("portal:home")).content.decode()
        assert (f'href="{cluster}"' in html) is sees, persona
    html = web_for("alice").get(reverse("portal:home")).content.decode()
    assert f'href="{reverse("portal:tenant-dashboard", kwargs={"pk": org.alpha.pk})}"' in html
    html = web_for("dana").get(reverse("portal:home")).content.decode()
    assert f'href="{reverse("portal:tenant-dashboard", kwargs={"pk": org.research.pk})}"' in html
