"""devcluster's plane and build cache: the parts that need no binaries, then a real lifecycle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from kubernetes import client, config

from devcluster import build
from devcluster.plane import ControlPlane, _alive
from devcluster.versions import COMMANDS, PEERS
from tests.k8s.real_plane import drained, require_binaries


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("GANTRY_CONTROL_PLANE_CACHE", str(cache))
    return cache


PLANE = [module for module in COMMANDS if module not in PEERS]  # what the tests need


def test_missing_names_every_module_of_an_empty_cache(empty_cache: Path) -> None:
    assert build.missing() == PLANE
    assert build.missing(peers=True) == list(COMMANDS)


def test_missing_forgets_a_module_once_all_its_binaries_are_cached(empty_cache: Path) -> None:
    release, commands = COMMANDS["etcd"]
    folder = empty_cache / f"etcd-{release}"
    folder.mkdir(parents=True)
    for name in commands:
        (folder / name).write_text("")
    assert build.missing() == [m for m in PLANE if m != "etcd"]


def test_a_half_cached_module_is_still_missing(empty_cache: Path) -> None:
    release, commands = COMMANDS["kubernetes"]
    folder = empty_cache / f"kubernetes-{release}"
    folder.mkdir(parents=True)
    (folder / next(iter(commands))).write_text("")  # one of three binaries
    assert "kubernetes" in build.missing()


def test_start_without_binaries_says_how_to_build_and_leaves_nothing_running(
    empty_cache: Path, tmp_path: Path
) -> None:
    plane = ControlPlane(tmp_path / "plane")
    with pytest.raises(RuntimeError, match="devcluster build"):
        plane.start()
    assert plane.state is None and not plane.running()
    assert not (tmp_path / "plane" / "state.json").exists()


def test_kubeconfig_names_the_plane_and_the_admins_certificate(
    empty_cache: Path, tmp_path: Path
) -> None:
    plane = ControlPlane(tmp_path / "plane")
    with pytest.raises(RuntimeError):
        plane.start()  # the kubeconfigs are written before the first process starts
    raw = json.loads(plane.kubeconfig.read_text())
    (context,) = raw["contexts"]
    assert raw["current-context"] == context["name"] == "admin"
    assert oct(plane.kubeconfig.stat().st_mode & 0o777) == "0o600"
    configuration = client.Configuration()
    config.load_kube_config(str(plane.kubeconfig), client_configuration=configuration)
    assert configuration.host.startswith("https://127.0.0.1:")
    assert Path(configuration.ssl_ca_cert).read_bytes() == plane.pki.ca.read_bytes()
    assert Path(configuration.cert_file).read_bytes() == plane.pki.client("admin")[0].read_bytes()
    for component in ("controller-manager", "scheduler"):
        other = json.loads((tmp_path / "plane" / f"kubeconfig-{component}").read_text())
        assert other["users"][0]["user"]["client-certificate"].endswith(f"{component}.crt")


def test_stop_is_idempotent(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path / "never-started")
    plane.stop()
    plane.stop()
    assert plane.state is None and not plane.running()


@pytest.mark.kubernetes
def test_start_restart_compact_stop(tmp_path: Path) -> None:
    require_binaries()
    plane = ControlPlane(tmp_path / "plane").start(controller_manager=False)
    try:
        assert plane.state is not None
        pids, port = dict(plane.state.pids), plane.state.apiserver_port
        assert set(pids) == {"etcd", "kube-apiserver"} and plane.running()
        with plane.request("/readyz") as answer:
            assert answer.status == 200

        plane.restart_apiserver()
        assert plane.state.apiserver_port == port  # kubeconfigs stay valid
        assert plane.state.pids["kube-apiserver"] != pids["kube-apiserver"]
        assert not _alive(pids["kube-apiserver"])
        with plane.request("/readyz") as answer:
            assert answer.status == 200

        first = plane.compact()
        api = config.new_client_from_config(str(plane.kubeconfig))
        body = {"metadata": {"name": "after-compaction"}}
        drained(client.CoreV1Api(api).create_namespace(body, _preload_content=False))
        api.close()
        assert plane.compact() > first  # the write moved the store past the compaction
    finally:
        plane.stop()
    assert not any(_alive(pid) for pid in pids.values())
    assert not plane.running() and not (tmp_path / "plane" / "state.json").exists()
    plane.stop()  # again: nothing to do, no error
    assert ControlPlane(tmp_path / "plane").state is None  # another shell sees it stopped
    assert os.path.exists(plane.kubeconfig)
