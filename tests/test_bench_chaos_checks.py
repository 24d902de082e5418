"""bench/chaos/checks.py: each promise broken on purpose in a small history is counted
exactly once, and a clean history counts nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.chaos.checks import (
    COUNTS,
    broken,
    double_allocations,
    main,
    quota_peaks,
    run_checks,
)
from billing.metering.hourly import meter_usage
from billing.models import MeteringPeriod, UsageRecord
from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobState, Node
from tenants.models import Quota
from tests import factories as f
from tests.billing.builders import at, hold, job_for, make_node
from tests.conftest import Org

S = JobState
MINUTE = 1 / 60


def clean_history(org: Org) -> tuple[Node, list[str]]:
    """A finished job, a running one, two fractional jobs sharing a device, a device handed
    on at the very instant it is given back, best-effort work beyond alpha's limit, and the
    closed hours metered. Returns the node and the running pods."""
    node = make_node()
    done = job_for(org, state=S.SUCCEEDED, replicas=2)
    hold(done, node, 0, 1.5, [1000, 1000], replica=0)
    hold(done, node, 0, 1.5, [1000, 1000], first_device=2, replica=1)
    hold(job_for(org, state=S.SUCCEEDED), node, 1.5, 2.5, [1000])  # device 0, from 1.5
    for offset in (0, 0.5):
        hold(job_for(org, state=S.SUCCEEDED, gpu_milli_per_replica=500), node, offset, 2, [500],
             first_device=4)  # fmt: skip
    running = job_for(org, state=S.RUNNING)
    live = hold(running, node, 2.5, None, [1000], first_device=5)
    spare = job_for(org, state=S.SUCCEEDED, priority_class=f.priority("best-effort"))
    hold(spare, node, 0, 3, [1000, 1000], first_device=6)
    # Alpha holds at most 5 GPUs (0.5 to 1.5: 4 + 0.5 + 0.5), the best-effort job aside.
    Quota.objects.filter(tenant=org.alpha).update(guaranteed_milli=1000, limit_milli=5000)
    meter_usage(now=at(3.5))
    job_for(org)  # queued
    job_for(org, state=S.PENDING_APPROVAL)
    return node, [live.pod_name]


def test_a_clean_history_breaks_no_promise(org: Org) -> None:
    _, pods = clean_history(org)
    assert MeteringPeriod.objects.count() == 3 and UsageRecord.objects.exists()
    counts = run_checks(pods=pods, submitted=list(Job.objects.values_list("pk", flat=True)))
    assert set(counts) == set(COUNTS)
    assert counts == {name: 0 for name in COUNTS} | {"jobs": 8, "not_settled": 3}
    assert broken(counts) == []


def test_quota_peaks_are_the_highest_level_held_beside_the_limits(org: Org) -> None:
    """The run reports how close its tenants came to their limits: a breach count of zero
    says little of a run whose tenants never neared them."""
    node, _ = clean_history(org)
    flavor = Quota.objects.get(tenant=org.alpha).flavor.name
    peaks = quota_peaks()
    # Alpha's 5 (0.5 to 1.5 of the clean history), the best-effort job not counted.
    assert peaks[f"{org.alpha.slug}/{flavor}"] == {
        "peak_gpus": 5.0,
        "guaranteed_gpus": 1.0,
        "limit_gpus": 5.0,
    }
    hold(job_for(org, state=S.SUCCEEDED), node, 4, 5, [250], first_device=7)
    assert quota_peaks()[f"{org.alpha.slug}/{flavor}"]["peak_gpus"] == 5.0  # 1.25 then
    assert quota_peaks()[f"{org.research.slug}/{flavor}"]["peak_gpus"] == 5.0


def test_two_shares_summing_1250_milli_on_one_device_are_one_double_allocation(
    org: Org,
) -> None:
    node, pods = clean_history(org)
    # Device 7 held 750 (at 4 to 6) and 500 (at 5 to 7): over 1,000 from 5 to 6, once.
    hold(job_for(org, state=S.SUCCEEDED), node, 4, 6, [750], first_device=7)
    hold(job_for(org, state=S.SUCCEEDED), node, 5, 7, [500], first_device=7)
    counts = run_checks(pods=pods)
    assert counts["double_allocations"] == 1
    assert broken(counts) == ["double_allocations=1"]


def test_a_tenant_over_its_limit_for_a_minute_is_one_breach(org: Org) -> None:
    node, pods = clean_history(org)
    # Alpha's limit is 5 GPUs: 1 running, 3 held from 4 to 6, 2 more for a minute from 5.
    hold(job_for(org, state=S.SUCCEEDED, replicas=3), node, 4, 6, [1000, 1000, 1000])
    hold(job_for(org, state=S.SUCCEEDED), node, 5, 5 + MINUTE, [1000, 1000], first_device=3)
    assert run_checks(pods=pods)["quota_breaches"] == 1


def test_two_teams_within_their_limits_over_their_parents_is_one_breach(org: Org) -> None:
    node, pods = clean_history(org)
    Quota.objects.filter(tenant=org.bravo).update(guaranteed_milli=1000)
    Quota.objects.filter(tenant=org.research).update(guaranteed_milli=2000, limit_milli=6000)
    # Research may hold 6: alpha's running 1 and 2 more, and bravo's 4, from 4 to 5, hold 7.
    hold(job_for(org, state=S.SUCCEEDED), node, 4, 5, [1000, 1000])
    bravo = job_for(org, "bob-bravo", project=org.proj_bravo, state=S.SUCCEEDED)
    hold(bravo, make_node("n2"), 4, 5, [1000, 1000, 1000, 1000])
    assert run_checks(pods=pods)["quota_breaches"] == 1


def test_a_user_over_the_cap_per_user_for_a_minute_is_one_breach(org: Org) -> None:
    node, pods = clean_history(org)
    # Any one user of alpha may hold 5 GPUs, alpha 8. Alice (every job of the clean history,
    # 5 at most) holds 1 running and 3 from 4 to 6, tina 2 beside her: alpha holds 6.
    Quota.objects.filter(tenant=org.alpha).update(limit_milli=8000, user_limit_milli=5000)
    hold(job_for(org, state=S.SUCCEEDED), node, 4, 6, [1000, 1000, 1000])
    hold(job_for(org, "tina", state=S.SUCCEEDED), node, 4, 6, [1000, 1000], first_device=3)
    assert run_checks(pods=pods)["quota_breaches"] == 0
    # Alice takes 2 more for a minute: 6 > 5 for her, alpha's 8 within its limit.
    hold(job_for(org, state=S.SUCCEEDED), node, 5, 5 + MINUTE, [1000, 1000], first_device=6)
    assert run_checks(pods=pods)["quota_breaches"] == 1


@pytest.mark.parametrize(
    ("state", "attempt", "end_reason"),
    [
        pytest.param(S.SUCCEEDED, 0, "", id="job-finished"),
        pytest.param(S.RUNNING, 1, "", id="attempt-superseded"),
        pytest.param(S.RUNNING, 0, "scaled down", id="marked-to-stop"),
    ],
)
def test_an_allocation_that_ended_without_ended_at_is_open_ended(
    org: Org, state: str, attempt: int, end_reason: str
) -> None:
    node, pods = clean_history(org)
    job = job_for(org, state=state, attempt=attempt)
    if state == S.RUNNING:  # it still runs, on an allocation of its own attempt
        pods.append(hold(job, node, 4, None, [1000], replica=1).pod_name)
    stale = hold(job, node, 4, None, [1000], first_device=1, attempt=0)
    Allocation.objects.filter(pk=stale.pk).update(end_reason=end_reason)
    counts = run_checks(pods=[*pods, stale.pod_name])
    assert counts["open_ended_allocations"] == 1
    assert counts["lost"] == 0


def test_an_ended_allocation_still_holding_its_share_is_open_ended(org: Org) -> None:
    node, pods = clean_history(org)
    ended = hold(job_for(org, state=S.SUCCEEDED), node, 4, 5, [500, 500])
    AllocationDevice.objects.filter(allocation=ended).update(released=False)
    assert run_checks(pods=pods)["open_ended_allocations"] == 1


def test_a_pod_without_an_active_allocation_is_an_orphan(org: Org) -> None:
    _, pods = clean_history(org)
    ended = Allocation.objects.filter(ended_at__isnull=False).first()
    assert ended is not None
    # One pod never allocated, one of an allocation that ended; the live one is no orphan.
    assert run_checks(pods=[*pods, "gantry-999-a0-r0", ended.pod_name])["orphan_pods"] == 2
    assert run_checks(pods=None)["orphan_pods"] == 0


def test_an_hour_metered_twice_is_one_mismatch(org: Org) -> None:
    _, pods = clean_history(org)
    # A second period over the half hour 1.5 to 2, with a second record of the best-effort
    # job's time then (it held two devices from 0 to 3).
    twice = MeteringPeriod.objects.create(start=at(1.5), end=at(2), metered_at=at(3.5))
    record = UsageRecord.objects.get(allocation__job__priority_class__name="best-effort",
                                     start=at(1))  # fmt: skip
    record.pk, record.period = None, twice
    record.start, record.micros = at(1.5), 1_800_000_000
    record.save()
    assert run_checks(pods=pods)["metered_mismatch"] == 1


@pytest.mark.parametrize(
    "change",
    [
        pytest.param("ended-later", id="ended-inside-an-hour-metered-before"),
        pytest.param("record-lost", id="an-hour-not-metered"),
        pytest.param("wrong-share", id="metered-the-wrong-share"),
        pytest.param("shifted", id="the-right-total-but-half-an-hour-metered-twice"),
    ],
)
def test_metered_time_that_differs_from_the_allocation_is_one_mismatch(
    org: Org, change: str
) -> None:
    _, pods = clean_history(org)
    spare = Allocation.objects.get(job__priority_class__name="best-effort")
    records = UsageRecord.objects.filter(allocation=spare)
    if change == "ended-later":
        Allocation.objects.filter(pk=spare.pk).update(ended_at=at(2.5))
    elif change == "record-lost":
        records.filter(start=at(1)).delete()
    elif change == "wrong-share":
        records.filter(start=at(1)).update(gpu_milli=1500)
    else:  # the hour from 2 recorded as from 1.5: as long, but over the end of hour 1's
        records.filter(start=at(2)).update(start=at(1.5), end=at(2.5))
    assert run_checks(pods=pods)["metered_mismatch"] == 1


def test_nothing_metered_is_no_mismatch(org: Org) -> None:
    hold(job_for(org, state=S.SUCCEEDED), make_node(), 0, 1, [1000])
    assert run_checks(pods=None)["metered_mismatch"] == 0


@pytest.mark.parametrize(
    ("state", "held", "lost"),
    [
        pytest.param(S.RUNNING, None, 1, id="running-with-no-allocation"),
        pytest.param(S.RUNNING, "old-attempt", 1, id="running-on-an-old-attempt-only"),
        pytest.param(S.BINDING, None, 1, id="binding-with-nothing-to-bind"),
        pytest.param(S.ADMITTED, None, 1, id="admitted-with-nothing-to-bind"),
        pytest.param(S.ADMITTED, "current", 0, id="admitted-with-its-allocation"),
        pytest.param(S.PREEMPTED, None, 1, id="preempted-holding-nothing"),
        pytest.param(S.PREEMPTED, "current", 0, id="preempted-while-its-pods-stop"),
        pytest.param(S.QUEUED, None, 0, id="queued"),
        pytest.param(S.PENDING_APPROVAL, None, 0, id="pending-approval"),
        pytest.param(S.FAILED, None, 0, id="failed"),
    ],
)
def test_a_job_with_no_way_forward_is_lost(
    org: Org, state: str, held: str | None, lost: int
) -> None:
    node, pods = clean_history(org)
    job = job_for(org, state=state, attempt=1)
    if held is not None:
        allocation = hold(job, node, 4, None, [1000], attempt=1 if held == "current" else 0)
        pods.append(allocation.pod_name)
    assert run_checks(pods=pods)["lost"] == lost


def test_a_submitted_job_missing_is_lost(org: Org) -> None:
    _, pods = clean_history(org)
    submitted = list(Job.objects.values_list("pk", flat=True))
    gone = job_for(org)
    submitted.append(gone.pk)
    gone.delete()
    counts = run_checks(pods=pods, submitted=submitted)
    assert (counts["lost"], counts["jobs"]) == (1, 8)


def test_the_command_exits_non_zero_naming_the_broken_promise(
    org: Org, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, live = clean_history(org)
    pods = tmp_path / "pods.txt"
    pods.write_text("\n".join([*live, "gantry-999-a0-r0"]) + "\n")
    out = tmp_path / "counts.json"
    assert main(["--pods", str(pods), "--json", str(out)]) == 1
    assert "PROMISES BROKEN: orphan_pods=1" in capsys.readouterr().err
    assert '"orphan_pods": 1' in out.read_text()
    pods.write_text("\n".join(live) + "\n")
    assert main(["--pods", str(pods)]) == 0


# --- the sweep, on random histories ------------------------------------------------------

# One device's history: lanes whose shares sum to at most 1,000 milli, each lane a run of
# shares one after another (a gap, or none, between them), so the device is never over.
lane = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=4
)  # (gap before, length) in minutes
device_history = st.lists(
    st.tuples(st.sampled_from([250, 500, 1000]), lane), min_size=1, max_size=3
).filter(lambda lanes: sum(milli for milli, _ in lanes) <= 1000)


def _share(job: Job, node: Node, device: GpuDevice, start: float, end: float, milli: int) -> None:
    allocation = f.AllocationFactory(
        job=job, node=node, replica=Allocation.objects.count(), gpu_milli=milli,
        started_at=at(start * MINUTE), ended_at=at(end * MINUTE),
    )  # fmt: skip
    AllocationDevice.objects.create(
        allocation=allocation, device=device, milli=milli, released=True
    )


@pytest.fixture
def two_devices(org: Org) -> tuple[Job, Node, list[GpuDevice]]:
    node = make_node(gpus=2)
    return job_for(org, state=S.SUCCEEDED), node, list(node.devices.order_by("index"))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(histories=st.lists(device_history, min_size=2, max_size=2), data=st.data())
def test_histories_within_each_device_have_no_double_allocation_and_one_overlap_has_one(
    two_devices: tuple[Job, Node, list[GpuDevice]], histories: list[Any], data: st.DataObject
) -> None:
    job, node, devices = two_devices
    with transaction.atomic():
        intervals: list[tuple[int, int, int]] = []  # (device, start, end) of each share
        for index, lanes in enumerate(histories):
            for milli, shares in lanes:
                clock = 0
                for gap, length in shares:
                    start, clock = clock + gap, clock + gap + length
                    _share(job, node, devices[index], start, clock, milli)
                    intervals.append((index, start, clock))
        assert double_allocations() == 0
        # A whole device taken inside one share's time: over 1,000 for that stretch only.
        index, start, end = data.draw(st.sampled_from(intervals))
        inner = data.draw(st.tuples(st.integers(start, end - 1), st.integers(1, end - start)))
        _share(job, node, devices[index], inner[0], min(end, inner[0] + inner[1]), 1000)
        assert double_allocations() == 1
        transaction.set_rollback(True)


def test_shares_of_a_device_given_back_and_taken_at_one_instant_never_overlap(
    two_devices: tuple[Job, Node, list[GpuDevice]],
) -> None:
    job, node, devices = two_devices
    for start in range(5):  # five whole-device shares end to end
        _share(job, node, devices[0], start, start + 1, 1000)
    assert double_allocations() == 0
    _share(job, node, devices[0], 2, 2 + 1, 1)  # one milli more during the third
    assert double_allocations() == 1


def test_over_the_cap_across_an_instant_where_shares_change_is_one_breach(
    two_devices: tuple[Job, Node, list[GpuDevice]],
) -> None:
    job, node, devices = two_devices
    # 600 held 0 to 10; 600 from 2 to 5, then another 600 from 5 to 8: over from 2 to 8.
    _share(job, node, devices[0], 0, 10, 600)
    _share(job, node, devices[0], 2, 5, 600)
    _share(job, node, devices[0], 5, 8, 600)
    assert double_allocations() == 1
    _share(job, node, devices[1], 0, 1, 1000)
    _share(job, node, devices[1], 0, 1, 1)
    assert double_allocations() == 2
