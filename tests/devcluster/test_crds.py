"""The workload kinds' CRDs (issue 37): fetched from their Go modules at the pinned releases,
cached by release, installed into a real plane, where an object of each kind is created, read
back, and refused when it breaks the release's schema."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster import crds
from devcluster.__main__ import main
from tests.k8s.real_plane import RealPlane, drained

Obj = dict[str, Any]
PAUSE = {"name": "c", "image": "registry.k8s.io/pause:3.10"}
POD = {"spec": {"restartPolicy": "Never", "containers": [PAUSE]}}

# The smallest valid object of each kind, and a path into it that the read-back must keep.
SPECS: dict[str, tuple[Obj, tuple[str, ...]]] = {
    "JobSet": (
        {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {"template": POD}}}]},
        ("replicatedJobs", "0", "replicas"),
    ),
    "LeaderWorkerSet": (
        {"replicas": 1, "leaderWorkerTemplate": {"size": 4, "workerTemplate": POD}},
        ("leaderWorkerTemplate", "size"),
    ),
    "TrainJob": ({"runtimeRef": {"name": "torch-distributed"}}, ("runtimeRef", "name")),
    "PyTorchJob": (
        {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": POD}
            }
        },
        ("pytorchReplicaSpecs", "Master", "replicas"),
    ),
    "RayJob": (
        {
            "entrypoint": "python -c 'print(1)'",
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": POD}},
        },
        ("entrypoint",),
    ),
}
# The same kinds with a field of the wrong type, which the release's schema refuses.
BROKEN: dict[str, Obj] = {
    "JobSet": {"replicatedJobs": "w"},
    "LeaderWorkerSet": {"replicas": "one"},
    "TrainJob": {"runtimeRef": "torch"},
    "PyTorchJob": {"pytorchReplicaSpecs": ["Master"]},
    "RayJob": {"entrypoint": 7},
}


def test_every_known_kind_has_an_object_to_create() -> None:
    assert set(SPECS) == set(BROKEN) == set(crds.KINDS)


def test_an_unknown_kind_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"VolcanoJob.*JobSet, LeaderWorkerSet"):
        crds.fetch("VolcanoJob")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GANTRY_CONTROL_PLANE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def require_go() -> None:
    if shutil.which("go") is None:
        pytest.skip("the Go toolchain is missing: the CRDs come from Go modules")


def test_fetch_is_cached_by_release_and_needs_no_go_the_second_time(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_go()
    first = crds.fetch("JobSet")
    source = crds.KINDS["JobSet"]
    assert source.folder == cache / "crds" / f"sigs.k8s.io_jobset-{source.release}"
    assert [p.name for p in source.folder.iterdir()] == ["jobset.x-k8s.io_jobsets.yaml"]
    # No Go and no proxy: a second fetch that tried either would fail.
    monkeypatch.setenv("PATH", str(tmp_path / "no-go"))
    monkeypatch.setenv("GOPROXY", "off")
    again = crds.fetch("JobSet")
    assert again == first
    assert first[0]["spec"]["names"]["kind"] == "JobSet"


def test_a_fetch_that_died_half_way_is_done_again(cache: Path) -> None:
    require_go()
    source = crds.KINDS["RayJob"]
    partial = source.folder.with_name(source.folder.name + ".partial")
    partial.mkdir(parents=True)
    (partial / "ray.io_rayjobs.yaml").write_text("cut short")
    assert [crd["spec"]["names"]["kind"] for crd in crds.fetch("RayJob")] == [
        "RayJob",
        "RayCluster",
    ]
    assert not partial.exists()


def test_without_go_a_missing_fetch_says_what_is_missing(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-go"))
    with pytest.raises(RuntimeError, match="Go toolchain is missing"):
        crds.fetch("LeaderWorkerSet")
    assert not (cache / "crds" / crds.KINDS["LeaderWorkerSet"].folder.name).exists()


def test_the_cli_refuses_an_unknown_kind_and_fetches_nothing(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["crds", "JobSet", "Volcano"]) == 2
    assert "unknown kind Volcano: one of JobSet" in capsys.readouterr().err
    assert not (cache / "crds").exists()


def test_the_cli_fetches_then_says_the_plane_is_not_running(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_go()
    assert main(["--dir", str(tmp_path / "plane"), "crds", "--install", "PyTorchJob"]) == 1
    out = capsys.readouterr()
    assert (
        f"PyTorchJob: github.com/kubeflow/training-operator {crds.KINDS['PyTorchJob'].release}"
        in out.out
    )
    assert "not running" in out.err
    assert crds.KINDS["PyTorchJob"].folder.is_dir()


def test_resource_names_the_storage_version() -> None:
    require_go()
    assert crds.resource("JobSet") == crds.Resource(
        "jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", True
    )


# -- on a real plane ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(real_plane: RealPlane) -> Iterator[tuple[client.ApiClient, str, dict[str, Any]]]:
    require_go()
    resources = crds.install(real_plane.api, crds.KINDS)
    namespace = f"crds-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(real_plane.api)
    drained(core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False))
    yield real_plane.api, namespace, resources
    drained(core.delete_namespace(namespace, _preload_content=False))


def _objects(api: client.ApiClient) -> Any:
    return client.CustomObjectsApi(api)


def _create(api: client.ApiClient, resource: crds.Resource, namespace: str, obj: Obj) -> Obj:
    response = _objects(api).create_namespaced_custom_object(
        resource.group, resource.version, namespace, resource.plural, obj, _preload_content=False
    )
    created: Obj = json.loads(response.data)
    response.release_conn()
    return created


@pytest.mark.kubernetes
@pytest.mark.parametrize("kind", list(SPECS))
def test_an_object_of_each_kind_is_created_and_read_back(
    installed: tuple[client.ApiClient, str, dict[str, crds.Resource]], kind: str
) -> None:
    api, namespace, resources = installed
    resource = resources[kind]
    spec, kept = SPECS[kind]
    name = kind.lower()
    body = {
        "apiVersion": f"{resource.group}/{resource.version}",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }
    _create(api, resource, namespace, body)
    response = _objects(api).get_namespaced_custom_object(
        resource.group, resource.version, namespace, resource.plural, name, _preload_content=False
    )
    read = json.loads(response.data)
    response.release_conn()
    assert read["kind"] == kind
    assert _at(read["spec"], kept) == _at(spec, kept)


@pytest.mark.kubernetes
@pytest.mark.parametrize("kind", list(BROKEN))
def test_an_object_against_the_releases_schema_is_refused(
    installed: tuple[client.ApiClient, str, dict[str, crds.Resource]], kind: str
) -> None:
    api, namespace, resources = installed
    resource = resources[kind]
    body = {
        "apiVersion": f"{resource.group}/{resource.version}",
        "kind": kind,
        "metadata": {"name": f"broken-{kind.lower()}"},
        "spec": BROKEN[kind],
    }
    with pytest.raises(ApiException) as refused:
        _create(api, resource, namespace, body)
    assert refused.value.status == 422


@pytest.mark.kubernetes
def test_installing_again_puts_back_the_pinned_definition(
    installed: tuple[client.ApiClient, str, dict[str, crds.Resource]],
) -> None:
    api, _, resources = installed
    extensions: Any = client.ApiextensionsV1Api(api)
    name = "jobsets.jobset.x-k8s.io"
    changed = {"metadata": {"labels": {"changed-by": "someone"}}}
    drained(extensions.patch_custom_resource_definition(name, changed, _preload_content=False))
    assert crds.install(api, ["JobSet"]) == {"JobSet": resources["JobSet"]}
    response = extensions.read_custom_resource_definition(name, _preload_content=False)
    assert "changed-by" not in (json.loads(response.data)["metadata"].get("labels") or {})
    response.release_conn()


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for step in path:
        obj = obj[int(step)] if isinstance(obj, list) else obj[step]
    return obj
