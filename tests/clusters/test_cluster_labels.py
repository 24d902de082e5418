"""Clusters named by their labels (docs/multicluster.md, "Data locality and labels"): a
cluster carries Kubernetes-style labels beside region and site (what data it holds, what it
offers); a job requires clusters by `placement.cluster_labels` and prefers them by
`placement.preferred_cluster_labels`. Checked at submit with what was wrong, and followed by
the daemon driving two simulated clusters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.backends.federated import Member, federate
from scheduler.backends.simulated.cluster import SimulatedCluster
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.models import Allocation, Cluster, Job, JobState
from tests.conftest import job_spec
from tests.daemon.conftest import Env, FakeClock, make_env, watched

pytestmark = pytest.mark.django_db
IMAGENET = "data.example.com/imagenet"
LAION = "data.example.com/laion"


def sim(count: int, clock: FakeClock) -> SimulatedCluster:
    return SimulatedCluster(
        make_nodes(count, "H100-80GB", 8, prefix="h100"),
        clock=clock,
        start_delay_s=1.0,
        grace_cap_s=2.0,
        retry_sleep=lambda _s: None,
    )


@pytest.fixture
def fenv(org: Any) -> Iterator[Env]:
    """Home ("local", holding laion) and b (in eu, holding imagenet), two nodes of 8 GPUs each."""
    clock = FakeClock()
    Cluster.objects.filter(home=True).update(labels={"region": "us", LAION: "true"})
    Cluster.objects.create(name="b", backend="simulated", labels={"region": "eu", IMAGENET: "true"})
    fed = federate(
        [
            Member("local", sim(2, clock), home=True, labels={"region": "us"}),
            Member("b", sim(2, clock), labels={"region": "eu"}),
        ],
        clock=clock,
    )
    yield from watched(Env(org, clock, fed))  # type: ignore[arg-type]


def clusters_of(job: Job) -> set[str]:
    return set(Allocation.objects.filter(job=job).values_list("node__cluster__name", flat=True))


def test_each_job_runs_where_its_data_is_while_it_fits_there(fenv: Env) -> None:
    daemon = fenv.daemon()
    duration = {"duration_s": 10_000}
    on_imagenet = [
        fenv.submit(
            resources={"gpus": 8},
            placement={"preferred_cluster_labels": {IMAGENET: "true"}},
            simulation=duration,
        )
        for _ in range(2)
    ]
    on_laion = [
        fenv.submit(
            resources={"gpus": 4},
            placement={"preferred_cluster_labels": {LAION: "true"}},
            simulation=duration,
        )
        for _ in range(2)
    ]
    fenv.run(daemon, seconds=2, cycles=3)
    for job in on_imagenet:
        job.refresh_from_db()
        assert job.state == JobState.RUNNING
        assert clusters_of(job) == {"b"}
    for job in on_laion:
        assert clusters_of(job) == {"local"}
    # a preference is not a requirement: with b full, the next imagenet job runs at home
    third = fenv.submit(
        resources={"gpus": 8},
        placement={"preferred_cluster_labels": {IMAGENET: "true"}},
        simulation=duration,
    )
    fenv.run(daemon, seconds=2, cycles=3)
    assert clusters_of(third) == {"local"}


def test_a_job_requiring_labels_runs_only_in_a_cluster_carrying_them(fenv: Env) -> None:
    daemon = fenv.daemon()
    eu = [
        fenv.submit(
            resources={"gpus": 8},
            placement={"cluster_labels": {"region": "eu"}},
            simulation={"duration_s": 10_000},
        )
        for _ in range(3)
    ]
    fenv.run(daemon, seconds=2, cycles=3)
    states = []
    for job in eu:
        job.refresh_from_db()
        states.append(job.state)
    assert states.count(JobState.RUNNING) == 2  # b's two nodes; home has room but is not eu
    assert all(clusters_of(j) <= {"b"} for j in eu)
    waiting = next(j for j in eu if j.state == JobState.QUEUED)
    assert "0 free in total" in waiting.reason, waiting.reason  # b alone counts


def test_a_cluster_that_loses_the_labels_a_queued_job_requires_leaves_it_waiting_saying_why(
    fenv: Env,
) -> None:
    daemon = fenv.daemon()
    Cluster.objects.filter(name="b").update(labels={"region": "eu", IMAGENET: "true"})
    job = fenv.submit(resources={"gpus": 8}, placement={"cluster_labels": {IMAGENET: "true"}})
    Cluster.objects.filter(name="b").update(labels={"region": "eu"})
    fenv.run(daemon, seconds=2, cycles=2)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert "in a cluster with the labels it asks for (no cluster has them now)" in job.reason
    # labelled again: it runs there, at the next cycles (the snapshot reads labels as they are)
    Cluster.objects.filter(name="b").update(labels={"region": "eu", IMAGENET: "true"})
    fenv.run(daemon, seconds=2, cycles=3)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert clusters_of(job) == {"b"}


@pytest.mark.parametrize(
    ("placement", "words"),
    [
        (
            {"cluster_labels": {IMAGENET: "true", "region": "us"}},
            f"no cluster carries {IMAGENET}=true, region=us; clusters' labels: b "
            f"{{{IMAGENET}=true, region=eu}}; local {{{LAION}=true, region=us}}.",
        ),
        (
            {"clusters": ["local"], "cluster_labels": {IMAGENET: "true"}},
            f"no cluster among local carries {IMAGENET}=true",
        ),
        ({"cluster_labels": {"bad key": "x"}}, "'bad key' is not a label key"),
        ({"preferred_cluster_labels": {"region": "-eu"}}, "is not a label value"),
        ({"cluster_labels": ["region=eu"]}, "dictionary"),
    ],
    ids=["none-carries", "not-among-named", "bad-key", "bad-value", "not-an-object"],
)
def test_labels_no_cluster_carries_or_bad_ones_are_a_400_naming_them(
    fenv: Env, client_for: Any, placement: dict[str, Any], words: str
) -> None:
    body = {"project": fenv.org.proj_alpha.pk, "spec": job_spec(replicas=1, placement=placement)}
    answer = client_for("alice").post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 400, answer.json()
    assert words in str(answer.json()["errors"]), answer.json()
    assert not Job.objects.exists()


def test_admins_label_clusters_with_what_they_hold(org: Any, client_for: Any) -> None:
    home = Cluster.objects.get(home=True)
    answer = client_for("pat").patch(
        f"/api/v1/clusters/{home.pk}/",
        {"labels": {"region": "eu", IMAGENET: "true", "storage": "ceph_eu-1"}},
        format="json",
    )
    assert answer.status_code == 200, answer.json()
    assert answer.json()["labels"] == {"region": "eu", IMAGENET: "true", "storage": "ceph_eu-1"}
    home.refresh_from_db()
    assert home.labels[IMAGENET] == "true"
    too_many = {f"k{i}": "v" for i in range(33)}
    answer = client_for("pat").patch(
        f"/api/v1/clusters/{home.pk}/", {"labels": too_many}, format="json"
    )
    assert answer.status_code == 400
    assert "At most 32 labels" in str(answer.json()["errors"])
    home.refresh_from_db()
    assert "k0" not in home.labels


@pytest.fixture
def env(db: Any) -> Iterator[Env]:
    yield from watched(make_env())


def test_with_one_cluster_a_job_naming_it_runs(env: Env) -> None:
    """One cluster: its nodes carry no cluster label; a job naming it (by name or by its
    labels) runs there rather than waiting for nodes of a cluster name no node carries."""
    Cluster.objects.filter(home=True).update(labels={"region": "eu"})
    daemon = env.daemon()
    by_name = env.submit(placement={"clusters": ["local"]}, simulation={"duration_s": 600})
    by_label = env.submit(
        placement={"cluster_labels": {"region": "eu"}}, simulation={"duration_s": 600}
    )
    env.run(daemon, seconds=2, cycles=3)
    for job in (by_name, by_label):
        job.refresh_from_db()
        assert job.state == JobState.RUNNING, job.reason
