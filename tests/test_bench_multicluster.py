"""bench/multicluster.py: Kueue's scenario over two real control planes. The pieces (the
nodes' split, who ran where, MultiKueue's objects and Jobs), and Gantry's half at a tiny
fraction (MultiKueue's is left out here: Kueue's cold build is opt-in). No timing is asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import multicluster
from bench.k8s_kueue import NODES, Arrival, kueue_namespace, node_names
from bench.multicluster import Run, Runs, run_of, split_nodes


def test_the_nodes_are_split_whole_over_the_clusters() -> None:
    split = split_nodes(node_names())
    assert [len(nodes) for nodes in split.values()] == [38, 37]  # 75 nodes
    assert sorted(n for nodes in split.values() for n in nodes) == node_names()
    assert len(node_names()) == NODES


def _runs(*runs: Run) -> Runs:
    out = Runs()
    out.runs.extend(runs)
    return out


@pytest.mark.parametrize(
    ("runs", "twice"),
    [
        pytest.param([Run("east", "7", "0", 0, 1), Run("east", "7", "0", 0, 1)], 0,
                     id="two-replicas-on-one-plane"),
        pytest.param([Run("east", "7", "0", 0, 1), Run("west", "7", "1", 2, 3)], 0,
                     id="moved-after-it-stopped"),
        pytest.param([Run("east", "7", "0", 0, 5), Run("west", "7", "1", 2, 3)], 1,
                     id="overlapping-on-both-planes"),
        pytest.param([Run("east", "7", "0", 0, 1), Run("west", "7", "0", 5, 6)], 1,
                     id="one-attempt-on-both-planes"),
        pytest.param([Run("east", "7", "0", 0, 5), Run("west", "8", "0", 0, 5)], 0,
                     id="two-jobs"),
    ],
)  # fmt: skip
def test_a_job_ran_twice_when_its_runs_on_two_planes_overlap_or_share_an_attempt(
    runs: list[Run], twice: int
) -> None:
    assert _runs(*runs).ran_twice() == twice


def test_the_kubelets_duration_records_each_pods_start_by_job_and_attempt() -> None:
    runs = Runs()
    gantry_pod = {
        "metadata": {"labels": {"gantry.io/job-id": "12", "gantry.io/attempt": "1"}},
        "spec": {"containers": [{"env": [{"name": "BENCH_DURATION_S", "value": "0.5"}]}]},
    }
    assert runs.duration_for("east")(gantry_pod) == 0.5
    assert [(r.plane, r.job, r.attempt) for r in runs.runs] == [("east", "12", "1")]
    assert runs.runs[0].end == pytest.approx(runs.runs[0].start + 0.5)
    kueue_pod = {
        "metadata": {
            "labels": {"batch.kubernetes.io/job-name": "small-0-0-0"},
            "ownerReferences": [{"kind": "Job", "uid": "u-1"}],
        }
    }
    assert run_of(kueue_pod) == ("small-0-0-0", "u-1")


def test_the_worker_kubeconfig_holds_its_credentials_inline(tmp_path: Path) -> None:
    """MultiKueue refuses a kubeconfig Secret naming files (certificate-authority, tokenFile)."""
    from devcluster.plane import ControlPlane, State

    plane = ControlPlane(tmp_path / "cp")
    plane.state = State(1, 2, 6443)
    from devcluster import certs

    certs.ensure(plane.pki.folder)
    config = multicluster.worker_kubeconfig(plane)
    (cluster,) = config["clusters"]
    (user,) = config["users"]
    assert cluster["cluster"]["server"] == "https://127.0.0.1:6443"
    assert set(cluster["cluster"]) == {"server", "certificate-authority-data"}
    assert set(user["user"]) == {"client-certificate-data", "client-key-data"}
    assert "file" not in yaml.safe_dump(config).lower()


def test_multikueue_dispatches_through_an_admission_check_on_its_config() -> None:
    objects = multicluster.multikueue_objects(("east", "west"))
    by_kind = {body["kind"]: body for _plural, body in objects}
    clusters = [b for _p, b in objects if b["kind"] == "MultiKueueCluster"]
    assert [c["spec"]["clusterSource"]["kubeConfig"] for c in clusters] == [
        {"locationType": "Secret", "location": "east-kubeconfig"},
        {"locationType": "Secret", "location": "west-kubeconfig"},
    ]
    assert by_kind["MultiKueueConfig"]["spec"]["clusters"] == ["east", "west"]
    check = by_kind["AdmissionCheck"]["spec"]
    assert check["controllerName"] == "kueue.x-k8s.io/multikueue"
    assert check["parameters"]["name"] == by_kind["MultiKueueConfig"]["metadata"]["name"]


def test_a_multikueue_job_is_queued_suspended_and_left_to_multikueue() -> None:
    large = Arrival(0.0, 1, 2, "large", 3, 4, 5, 1.0, 250)
    job = multicluster.multikueue_job(large)
    assert job["metadata"]["namespace"] == kueue_namespace(large.queue)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == large.queue
    assert job["spec"]["suspend"] is True
    assert job["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (5, 5)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "4"}


@pytest.mark.kubernetes
@pytest.mark.postgresql("the daemon and the submitter it forks share the database")
def test_gantry_runs_the_scenario_over_two_planes_and_nothing_runs_twice(
    transactional_db: Any, tmp_path: Path
) -> None:
    from tests.k8s.real_plane import require_binaries

    require_binaries()
    out = multicluster.run_multicluster(
        0.0001,
        multikueue=False,
        database_url=None,  # this test's database, as it is
        limit_s=300.0,
        work_dir=tmp_path,
        say=lambda _line: None,
    )
    assert set(out) == {"clusters", "gantry", "multikueue", "versions"}
    assert out["clusters"] == 2
    gantry = out["gantry"]
    assert set(gantry) == {"wall_s", "admission_mean_s", "ran_twice"}
    assert gantry["ran_twice"] == 0
    assert gantry["wall_s"] > 0
    assert set(gantry["admission_mean_s"]) == {"small", "medium", "large"}
    assert all(v is not None for v in gantry["admission_mean_s"].values())
    assert out["multikueue"] == {"error": multicluster.MULTIKUEUE_LEFT_OUT}
    assert set(out["versions"]) == {"kubernetes", "etcd", "kueue"}
