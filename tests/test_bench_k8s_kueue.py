"""bench/k8s_kueue.py: Kueue's scenario, its Workloads and the driver's status writes, and
Gantry's half at a tiny fraction on its own real control plane. Kueue's half is left out here:
its cold build is opt-in (make control-plane-peers). No timing is asserted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from django.db import connection

from bench import k8s_kueue
from bench.k8s_kueue import Arrival, plan
from tests.k8s.conftest import api_client_for, started_fake


def test_the_whole_scenario_is_kueues_15000_workloads_and_a_fraction_keeps_every_queue() -> None:
    whole = plan(1.0)
    assert len(whole) == 15_000
    assert Counter(a.klass for a in whole) == {
        "small": 10_500,
        "medium": 3_000,
        "large": 1_500,
    }
    tenth = plan(0.1)
    assert len(tenth) == 1_500
    assert len({a.queue for a in tenth}) == 30
    assert max(a.at_s for a in tenth if a.klass == "small") == pytest.approx(3.4)
    tiny = plan(0.0001)  # at least one of each class per queue
    assert len(tiny) == 90
    assert [a.at_s for a in tiny] == sorted(a.at_s for a in tiny)
    with pytest.raises(ValueError, match="fraction"):
        plan(0)


def test_a_large_workload_asks_for_the_gang_gantry_places() -> None:
    large = next(a for a in plan(0.01) if a.klass == "large")
    body = k8s_kueue.workload(large)
    pod_set = body["spec"]["podSets"][0]
    assert pod_set["count"] == 5
    assert pod_set["template"]["spec"]["containers"][0]["resources"]["requests"] == {
        "nvidia.com/gpu": "4"
    }
    assert body["spec"]["queueName"] == large.queue
    assert body["spec"]["priority"] == large.priority
    assert body["spec"]["priorityClassRef"]["name"] == "kueue-large"
    assert body["metadata"]["namespace"] == k8s_kueue.kueue_namespace(large.queue)


def test_kueue_and_gantry_are_given_the_same_job_but_for_queue_and_scheduler() -> None:
    """The halves from batch/v1 Jobs: one Job shape; Kueue's in its LocalQueue's namespace with
    its queue and priority labels, placed by kube-scheduler; Gantry's as its webhook stores it."""
    from scheduler.workloads.mutate import SCHEDULER_NAME

    large = next(a for a in plan(0.01) if a.klass == "large")
    kueue = k8s_kueue.kueue_job(large)
    gantry = k8s_kueue.native_job(large, "team-ns", "alice")
    assert kueue["metadata"]["namespace"] == k8s_kueue.kueue_namespace(large.queue)
    assert kueue["metadata"]["labels"] == {
        "kueue.x-k8s.io/queue-name": large.queue,
        "kueue.x-k8s.io/priority-class": "kueue-large",
    }
    assert "schedulerName" not in kueue["spec"]["template"]["spec"]  # kube-scheduler's
    assert gantry["spec"]["template"]["spec"].pop("schedulerName") == SCHEDULER_NAME
    assert kueue["spec"] == gantry["spec"]  # suspended, 5 x 4 GPUs, the duration, no retry
    assert kueue["spec"]["suspend"] is True
    assert (kueue["spec"]["parallelism"], kueue["spec"]["completions"]) == (5, 5)


def test_kueue_queues_the_gpus_alone_as_its_cluster_queues_cover_them(tmp_path: Path) -> None:
    config = k8s_kueue.kueue_config(tmp_path, 9443, 8081)
    k8s_kueue._jobs_config(config)
    assert config["resources"] == {"excludeResourcePrefixes": ["cpu", "memory"]}
    assert config["integrations"] == {"frameworks": ["batch/job"]}
    covered = {
        resource
        for plural, body in k8s_kueue.queue_objects()
        if plural == "clusterqueues"
        for group in body["spec"]["resourceGroups"]
        for resource in group["coveredResources"]
    }
    assert covered == {"nvidia.com/gpu"}


def test_the_jobs_driver_reads_the_arrival_from_the_workloads_owner() -> None:
    owned = {"metadata": {"name": "job-large-0-1-2-ab12c", "ownerReferences": [
        {"kind": "Job", "name": "large-0-1-2"}]}}  # fmt: skip
    driver = k8s_kueue.KueueJobsDriver.__new__(k8s_kueue.KueueJobsDriver)
    assert driver.arrival_name(owned) == "large-0-1-2"
    assert driver.arrival_name({"metadata": {"name": "large-0-1-2"}}) == ""  # not a Job's


def _workload(conditions: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "small-0-0-0", "namespace": "kueue-q", "generation": 3},
        "status": {"conditions": conditions, "admission": {"clusterQueue": "q"}, **status},
    }


def _condition(kind: str, status: str = "True") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": "X", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip


def test_an_evicted_workload_is_released_as_kueues_admission_manager_would() -> None:
    evicted = _workload(
        [_condition(c) for c in ("QuotaReserved", "Admitted", "Evicted", "Preempted")]
        + [_condition("PodsReady", "False")],
        requeueState={"count": 1},
    )
    body = k8s_kueue.requeued_status(evicted)
    status = body["status"]
    assert "admission" not in status  # applied by its owner without it: removed
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False"
    assert by_type["Admitted"]["status"] == "False"
    assert by_type["Evicted"]["status"] == "True"  # kept: Kueue reads why it was evicted
    assert "PodsReady" not in by_type  # not the admission manager's
    assert status["requeueState"] == {"count": 1}
    assert body["metadata"] == {"name": "small-0-0-0", "namespace": "kueue-q"}


def test_a_finished_workload_gets_only_the_finished_condition() -> None:
    body = k8s_kueue.finished_status(_workload([_condition("Admitted")]))
    assert [c["type"] for c in body["status"]["conditions"]] == ["Finished"]
    assert body["status"]["conditions"][0]["observedGeneration"] == 3


def test_the_converted_crds_point_at_kueues_webhook_on_loopback(tmp_path: Path) -> None:
    bases = tmp_path / "config/components/crd/bases"
    bases.mkdir(parents=True)
    for plural in ("workloads", "resourceflavors"):
        doc = {
            "metadata": {"name": f"{plural}.kueue.x-k8s.io"},
            "spec": {"names": {"plural": plural}},
        }
        (bases / f"{plural}.yaml").write_text(yaml.safe_dump(doc))
    by_plural = {d["spec"]["names"]["plural"]: d for d in k8s_kueue.crds(tmp_path, 9443)}
    conversion = by_plural["workloads"]["spec"]["conversion"]
    assert conversion["webhook"]["clientConfig"] == {"url": "https://127.0.0.1:9443/convert"}
    assert "conversion" not in by_plural["resourceflavors"]["spec"]
    signed = {d["spec"]["names"]["plural"]: d for d in k8s_kueue.crds(tmp_path, 9443, "Q0E=")}
    client_config = signed["workloads"]["spec"]["conversion"]["webhook"]["clientConfig"]
    assert client_config == {"url": "https://127.0.0.1:9443/convert", "caBundle": "Q0E="}


def test_kueues_webhook_serves_the_planes_certificate_for_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kueue's own certificate names its Service, and the API servers, calling its conversion
    webhook on 127.0.0.1, refused every conversion: its certificate manager is off, its
    webhook serves the plane's serving certificate, and the CRDs trust the plane's CA. Off,
    Kueue v0.17.0 exits without a metrics certificate at a fixed path: one is written there
    once, never replaced (another Kueue may be reading it)."""
    import base64
    from types import SimpleNamespace

    pki = tmp_path / "pki"
    pki.mkdir()
    for name, text in (("ca.crt", "CA"), ("serving.crt", "CERT"), ("serving.key", "KEY")):
        (pki / name).write_text(text)
    plane = SimpleNamespace(
        pki=SimpleNamespace(ca=pki / "ca.crt", serving=(pki / "serving.crt", pki / "serving.key"))
    )
    metrics = tmp_path / "etc/kueue/metrics/certs"
    monkeypatch.setattr(k8s_kueue, "METRICS_CERT_DIR", metrics)
    folder = tmp_path / "kueue"
    ca = k8s_kueue.serving_certs(plane, folder)  # type: ignore[arg-type]
    assert base64.b64decode(ca) == b"CA"
    config = k8s_kueue.kueue_config(folder, 9443, 8081)
    assert config["internalCertManagement"] == {"enable": False}
    served = Path(config["webhook"]["certDir"])
    assert (served / "tls.crt").read_text() == "CERT" and (served / "tls.key").read_text() == "KEY"
    assert (metrics / "tls.crt").read_text() == "CERT"
    (pki / "serving.crt").write_text("ANOTHER PLANE'S")
    k8s_kueue.serving_certs(plane, tmp_path / "second")
    assert (metrics / "tls.crt").read_text() == "CERT"


def test_tallies_measure_admission_from_creation_and_usage_over_the_whole_pool() -> None:
    arrivals = [
        Arrival(0.0, 0, 0, "small", 0, 1, 1, 0.2, 50),
        Arrival(0.0, 0, 0, "large", 0, 4, 5, 1.0, 250),
    ]
    tally = k8s_kueue.Tally(
        start=100.0,
        created={"small-0-0-0": 100.0, "large-0-0-0": 100.5},
        admitted={"small-0-0-0": 101.0, "large-0-0-0": 101.0},
        finished={"small-0-0-0": 101.5, "large-0-0-0": 102.0},
        gpu_s=600.0,
        running={"small-0-0-0": 101.25, "large-0-0-0": 101.5},
    )
    figures = tally.figures(arrivals)
    assert figures["wall_s"] == 2.0
    assert figures["admission_mean_s"] == {"small": 1.0, "medium": None, "large": 0.5}
    assert figures["running_mean_s"] == {"small": 1.25, "medium": None, "large": 1.0}
    assert figures["usage_pct"] == 50.0  # 600 GPU-s over 600 GPUs x 2 s
    assert (figures["admitted"], figures["finished"]) == (2, 2)


@pytest.mark.kubernetes
@pytest.mark.postgresql("the daemon and the submitter it forks share the database")
def test_gantry_runs_kueues_scenario_at_a_tiny_fraction_on_a_real_plane(
    transactional_db: Any, tmp_path: Path
) -> None:
    out = k8s_kueue.run_kueue_scenario(
        lambda: k8s_kueue.own_plane(tmp_path / "cp"),
        0.0001,
        kueue=False,
        database_url=None,  # this test's database, as it is
        limit_s=300.0,
        work_dir=tmp_path,
        say=lambda _line: None,
    )
    assert out["kueue"] == {"skipped": k8s_kueue.KUEUE_LEFT_OUT}
    assert (out["workloads"], out["nodes"], out["gpus"]) == (90, 75, 600)
    gantry = out["gantry"]
    assert gantry["finished"] == gantry["admitted"] == gantry["workloads"] == 90
    assert all(gantry["admission_mean_s"][c] is not None for c in ("small", "medium", "large"))
    assert gantry["wall_s"] > 0 and gantry["usage_pct"] > 0


def test_gantry_runs_kueues_scenario_from_jobs_created_in_kubernetes(
    transactional_db: Any, tmp_path: Path
) -> None:
    """The same arrivals as batch/v1 Jobs in the teams' namespaces: queued by the workload
    controller, admitted by the daemon, their pods made by the plane's job controller."""
    out = k8s_kueue.run_kueue_scenario(
        lambda: k8s_kueue.own_plane(tmp_path / "cp"),
        0.0001,
        kueue=False,
        native=True,
        from_database=False,
        database_url=None,
        limit_s=300.0,
        work_dir=tmp_path,
        say=lambda _line: None,
    )
    native = out["gantry_native"]
    assert "gantry" not in out and "kueue" not in out
    assert out["kueue_jobs"] == {"skipped": k8s_kueue.KUEUE_LEFT_OUT}
    # As deployed, a process of its own, where it can share the database (not SQLite's test
    # database in memory).
    assert native["controller"] == ("process" if connection.vendor == "postgresql" else "thread")
    assert native["created"] == native["queued"] == native["workloads"] == 90
    assert native["finished"] + native["ended_as_their_jobs_did"] == 90, native["not_finished"]
    assert all(native["admission_mean_s"][c] is not None for c in ("small", "medium", "large"))
    # each class's first pods seen running by the simulated kubelets, after their admission
    for c in ("small", "medium", "large"):
        assert native["running_mean_s"][c] is not None
        assert native["running_mean_s"][c] >= native["admission_mean_s"][c]


def test_the_native_half_creates_its_jobs_over_as_many_threads_as_kueues_half() -> None:
    """Gantry's half creates its Jobs as Kueue's half does, over CREATORS threads, each noted
    when its creation is asked: one thread made Gantry's Jobs arrive at the pace of one
    call after another."""
    arrivals = [Arrival(0.0, 0, t, "small", i, 1, 1, 1.0, 50) for t in range(2) for i in range(8)]
    targets = {a.queue: (f"ns-{a.team}", "alice") for a in arrivals}
    lock, running, most = threading.Lock(), [0], [0]
    all_in = threading.Barrier(k8s_kueue.CREATORS, timeout=10)

    class Batch:
        def create_namespaced_job(self, namespace: str, body: Any, **_: Any) -> Any:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            all_in.wait()  # every creator inside a call at once, or this times out
            with lock:
                running[0] -= 1
            return SimpleNamespace(data=b"{}", release_conn=lambda: None)

    created: dict[str, float] = {}
    k8s_kueue._job_submitter(Batch(), arrivals, targets, time.time(), created, threading.Event())
    assert most[0] == k8s_kueue.CREATORS == 8
    assert set(created) == {a.name for a in arrivals}


def test_a_half_leaves_no_job_or_pod_behind_for_the_next() -> None:
    """Kueue's half deletes its Jobs and pods before Gantry's starts (`clear_jobs`): left
    there, every pass of the simulated kubelets (a list of every bound pod) and the job
    controller carried them through Gantry's half, and Gantry's half alone ran faster."""
    fake = started_fake("n1")
    api = api_client_for(fake.url)
    try:
        for queue in ("a", "b"):
            namespace = k8s_kueue.kueue_namespace(queue)
            fake.add_namespace(namespace)
            for i in range(2):
                fake.create("jobs", namespace, {"metadata": {"name": f"j{i}"}, "spec": {}})
                fake.create("pods", namespace, {"metadata": {"name": f"j{i}-p"}, "spec": {}})
        fake.add_namespace("other")
        fake.create("pods", "other", {"metadata": {"name": "keep"}, "spec": {}})
        cleared = k8s_kueue.clear_jobs(api, ["kueue-a", "kueue-b"], timeout_s=10)
        assert cleared is not None
        for namespace in ("kueue-a", "kueue-b"):
            assert fake.list_objects("jobs", namespace, {})["items"] == []
            assert fake.list_objects("pods", namespace, {})["items"] == []
        assert fake.get("pods", "other", "keep") is not None
    finally:
        api.close()
        fake.stop()
