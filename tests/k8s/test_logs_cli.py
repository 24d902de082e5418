"""`gantry logs --follow` when the cluster breaks off the log (issue 20): against a live server
whose log source is the Kubernetes backend over the fake apiserver. The lines printed stand,
the CLI says that following stopped and how to read on, and exits non-zero (1: the server
answered 503), never with a traceback. Nothing sleeps: the CLI's and the backend's sleeps are
replaced."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from cli import client as cli_client
from cli import logs as cli_logs
from cli.main import main
from scheduler.backends.kubernetes.backend import KubernetesBackend
from tests.conftest import Org
from tests.k8s.builders import make_request
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.test_logs_api import placed_job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gantry(
    live_server: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    org: Org,
    backend: KubernetesBackend,
) -> Any:
    """gantry(*argv) -> (exit code, stdout, stderr) as alice, the server reading logs from
    the fake apiserver."""
    monkeypatch.setattr("scheduler.api.pods.log_source", lambda: backend)
    monkeypatch.setattr(cli_client, "sleep", lambda seconds: None)
    monkeypatch.setenv("GANTRY_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GANTRY_URL", live_server.url)
    monkeypatch.setenv("GANTRY_PASSWORD", "correct-horse-battery")
    monkeypatch.delenv("GANTRY_TOKEN", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(list(argv), out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    assert run("login", "alice")[0] == 0
    return run


def test_follow_broken_off_by_the_cluster_says_so_and_exits_1(
    gantry: Any,
    org: Org,
    fake: FakeApiServer,
    backend: KubernetesBackend,
    monkeypatch: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job, _ = placed_job(org)
    pod = make_request(job.pk)
    backend.create_pod(pod)
    backend.bind_pod(pod.namespace, pod.name, pod.node)
    fake.run_container(pod.namespace, pod.name)
    fake.write_log(pod.namespace, pod.name, "epoch 1", "epoch 2")

    def cut(seconds: float) -> None:
        """While the CLI waits between polls, the cluster starts cutting every log read."""
        fake.inject("reset", "/log$", count=100)

    monkeypatch.setattr(cli_logs, "sleep", cut)
    code, out, err = gantry("logs", str(job.pk), "--follow", "--tail", "5")
    err += capsys.readouterr().err  # `gantry logs` writes its messages to sys.stderr
    assert out.splitlines() == ["epoch 1", "epoch 2"]
    assert f"following job {job.pk}'s log stopped" in err
    assert f"`gantry logs {job.pk} --follow` follows it again" in err and "HTTP 503" in err
    assert "Traceback" not in err
    assert code == 1
