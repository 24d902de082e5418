"""The workload kinds' CRDs at pinned releases, from their Go modules (issue 37).

Each project ships its generated CRD YAML in its repository, and so in its Go module's zip.
`fetch(kind)` asks the Go toolchain for the module at the release devcluster/versions.py pins
(`go mod download`, through the module proxy, as the plane's build does), copies the kind's
CRD files into the control-plane cache (one folder per module and release, beside the
binaries) and reads them from there from then on: a second fetch runs no `go` at all. Nothing
is copied into the repository.

`install(api, kinds)` creates each kind's CRDs in a cluster (or updates them to the pinned
release) and returns once the API server serves every one of them (Established).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster.versions import JOBSET, KUBERAY, LWS, TRAINER, TRAINING_OPERATOR, cache_dir

Obj = dict[str, Any]
ESTABLISH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Source:
    """Where a kind's CRDs are in its module: its own first, then those it refers to (a
    TrainJob names a training runtime; a RayJob's operator makes a RayCluster)."""

    module: str
    release: str
    files: tuple[str, ...]

    @property
    def folder(self) -> Path:
        return cache_dir() / "crds" / f"{self.module.replace('/', '_')}-{self.release}"


TRAINER_CRDS = "manifests/base/crds/trainer.kubeflow.org_"
KINDS: dict[str, Source] = {
    "JobSet": Source(
        "sigs.k8s.io/jobset",
        JOBSET,
        ("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",),
    ),
    "LeaderWorkerSet": Source(
        "sigs.k8s.io/lws",
        LWS,
        ("config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",),
    ),
    "TrainJob": Source(
        "github.com/kubeflow/trainer/v2",
        TRAINER,
        tuple(
            f"{TRAINER_CRDS}{plural}.yaml"
            for plural in ("trainjobs", "trainingruntimes", "clustertrainingruntimes")
        ),
    ),
    "PyTorchJob": Source(
        "github.com/kubeflow/training-operator",
        TRAINING_OPERATOR,
        ("manifests/base/crds/kubeflow.org_pytorchjobs.yaml",),
    ),
    "RayJob": Source(
        "github.com/ray-project/kuberay/ray-operator",
        KUBERAY,
        ("config/crd/bases/ray.io_rayjobs.yaml", "config/crd/bases/ray.io_rayclusters.yaml"),
    ),
}


@dataclass(frozen=True)
class Resource:
    """What a client needs to reach a kind's objects (the CRD's storage version)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool


def source(kind: str) -> Source:
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"no CRDs known for kind {kind!r}: one of {', '.join(KINDS)}") from None


def fetch(kind: str) -> list[Obj]:
    """The kind's CustomResourceDefinitions at the pinned release, downloaded on first use."""
    wanted = cached(kind)
    return [_load(wanted.folder / Path(name).name) for name in wanted.files]


def cached(kind: str) -> Source:
    """The kind's source, its CRD files in the cache (downloaded if they were not)."""
    wanted = source(kind)
    if not _cached(wanted):
        cache_dir().mkdir(parents=True, exist_ok=True)
        with _locked(cache_dir() / ".crds.lock"):  # another process may be fetching it
            if not _cached(wanted):
                _store(wanted, go_download(wanted.module, wanted.release))
    return wanted


def resource(kind: str) -> Resource:
    return _resource(fetch(kind)[0])


def _resource(crd: Obj) -> Resource:
    spec = crd["spec"]
    (storage,) = (v["name"] for v in spec["versions"] if v.get("storage"))
    names = spec["names"]
    return Resource(
        spec["group"], storage, names["plural"], names["kind"], spec["scope"] == "Namespaced"
    )


def install(
    api: client.ApiClient, kinds: Iterable[str], timeout_s: float = ESTABLISH_TIMEOUT_S
) -> dict[str, Resource]:
    """Create (or update to the pinned release) each kind's CRDs, then wait until the API
    server serves them all. TimeoutError names a CRD not Established in time; RuntimeError
    one whose names the server refused."""
    extensions: Any = client.ApiextensionsV1Api(api)
    fetched = {kind: fetch(kind) for kind in kinds}
    names = [_apply(extensions, crd) for crds in fetched.values() for crd in crds]
    deadline = time.monotonic() + timeout_s
    for name in names:
        _wait_established(extensions, name, deadline)
    return {kind: _resource(crds[0]) for kind, crds in fetched.items()}


def fetch_all() -> list[Path]:
    """Every kind's CRDs into the cache (`python -m devcluster build` does it): the folders."""
    return sorted({cached(kind).folder for kind in KINDS})


# -- the Go module ----------------------------------------------------------------------------


def go_download(module: str, release: str) -> Path:
    """The module's folder in the Go module cache, downloaded through the proxy if absent."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("devcluster crds: the Go toolchain is missing (install Go 1.26+)")
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    with tempfile.TemporaryDirectory() as outside_any_module:
        done = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{release}"],
            cwd=outside_any_module,
            env=env,
            capture_output=True,
            text=True,
        )
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = {"Error": done.stderr.strip() or f"go exited {done.returncode}"}
    if answer.get("Error") or done.returncode != 0:
        raise RuntimeError(f"go mod download {module}@{release}: {answer.get('Error')}")
    return Path(answer["Dir"])


def _cached(wanted: Source) -> bool:
    return all((wanted.folder / Path(name).name).is_file() for name in wanted.files)


def _store(wanted: Source, module_dir: Path) -> None:
    """Copy the CRD files into a `.partial` folder, then rename it: a fetch that dies half-way
    leaves nothing that looks cached."""
    partial = wanted.folder.with_name(wanted.folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in wanted.files:
        found = module_dir / name
        if not found.is_file():
            shutil.rmtree(partial, ignore_errors=True)
            raise RuntimeError(f"{wanted.module}@{wanted.release} has no {name}")
        shutil.copyfile(found, partial / found.name)  # the module cache's files are read-only
    shutil.rmtree(wanted.folder, ignore_errors=True)
    partial.rename(wanted.folder)


def _load(path: Path) -> Obj:
    # libyaml's loader: these files are up to a few MB, which the pure-Python one reads slowly.
    docs = [d for d in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader) if d]
    (crd,) = (d for d in docs if d.get("kind") == "CustomResourceDefinition")
    return dict(crd)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# -- the cluster ------------------------------------------------------------------------------


def _apply(extensions: Any, crd: Obj) -> str:
    name: str = crd["metadata"]["name"]
    try:
        _drained(extensions.create_custom_resource_definition(crd, _preload_content=False))
    except ApiException as error:
        if error.status != 409:
            raise
        current = _json(extensions.read_custom_resource_definition(name, _preload_content=False))
        version = current["metadata"]["resourceVersion"]
        crd = {**crd, "metadata": {**crd["metadata"], "resourceVersion": version}}
        _drained(extensions.replace_custom_resource_definition(name, crd, _preload_content=False))
    return name


def _wait_established(extensions: Any, name: str, deadline: float) -> None:
    while True:
        found = _json(extensions.read_custom_resource_definition(name, _preload_content=False))
        conditions = {c["type"]: c for c in (found.get("status") or {}).get("conditions") or ()}
        if conditions.get("Established", {}).get("status") == "True":
            return
        refused = conditions.get("NamesAccepted", {})
        if refused.get("status") == "False":
            raise RuntimeError(f"CRD {name}: names not accepted: {refused.get('message')}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established in time; conditions: {conditions}")
        time.sleep(0.1)


def _json(response: Any) -> Obj:
    try:
        result: Obj = json.loads(response.data)
        return result
    finally:
        response.release_conn()


def _drained(response: Any) -> None:
    _json(response)
