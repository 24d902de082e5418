"""The `gantry` CLI against a live server: log in, submit, follow, cancel, and clear errors."""

from __future__ import annotations

import io
import json
import socketserver
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.client import _flatten
from cli.files import load_yaml
from cli.main import main
from scheduler.models import Job, JobState
from tests.conftest import Org, job_spec

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gantry(live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """gantry("jobs", "--json") -> (exit code, stdout, stderr) against the live server."""
    monkeypatch.setenv("GANTRY_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GANTRY_URL", live_server.url)
    monkeypatch.delenv("GANTRY_TOKEN", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(list(argv), out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    return run


@pytest.fixture
def logged_in(gantry: Any, org: Org, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("GANTRY_PASSWORD", "correct-horse-battery")
    code, _, err = gantry("login", "alice")
    assert code == 0, err
    return gantry


def test_login_saves_a_private_token(
    gantry: Any, org: Org, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GANTRY_PASSWORD", "correct-horse-battery")
    code, out, _ = gantry("login", "alice")
    assert code == 0
    config = tmp_path / "config.json"
    assert json.loads(config.read_text())["token"]
    assert config.stat().st_mode & 0o777 == 0o600
    code, out, _ = gantry("--json", "whoami")
    assert json.loads(out)["username"] == "alice"


def test_wrong_password_is_a_clear_error(
    gantry: Any, org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GANTRY_PASSWORD", "wrong")
    code, _, err = gantry("login", "alice")
    assert code == 1
    assert "HTTP 400" in err and "Unable to log in" in err


def test_submit_from_yaml_then_follow_and_cancel(logged_in: Any, org: Org, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(job_spec(name="cli-job")))
    code, out, err = logged_in("--json", "submit", str(spec_file), "--project", "proj-alpha")
    assert code == 0, err
    job = json.loads(out)
    assert (job["name"], job["state"], job["gpus_total"]) == ("cli-job", "queued", 8)

    code, out, _ = logged_in("jobs")
    assert "cli-job" in out and "queued" in out
    code, out, _ = logged_in("--json", "events", str(job["id"]))
    assert [e["kind"] for e in json.loads(out)] == ["submitted"]

    code, out, _ = logged_in("cancel", str(job["id"]), "--reason", "typo in args")
    assert code == 0
    assert Job.objects.get(pk=job["id"]).state == JobState.CANCELLED
    code, _, err = logged_in("cancel", str(job["id"]))
    assert code == 1 and "HTTP 409" in err and "already cancelled" in err


def test_invalid_spec_prints_each_field_error(logged_in: Any, org: Org, tmp_path: Path) -> None:
    spec = job_spec(replicas=0, resources={"gpus": 1.5})
    spec_file = tmp_path / "bad.json"
    spec_file.write_text(json.dumps(spec))
    code, _, err = logged_in("submit", str(spec_file), "--project", str(org.proj_alpha.pk))
    assert code == 1
    assert "spec.replicas:" in err
    assert "spec.resources.gpus: must be a whole number of GPUs" in err
    assert Job.objects.count() == 0


def submit_json(
    logged_in: Any, org: Org, tmp_path: Path, spec: dict[str, Any]
) -> tuple[int, str, str]:
    """`gantry submit` of `spec` as a JSON file, to project alpha."""
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    result: tuple[int, str, str] = logged_in(
        "submit", str(spec_file), "--project", str(org.proj_alpha.pk)
    )
    return result


def test_an_image_outside_the_tenants_registries_is_refused_naming_them(
    logged_in: Any, org: Org, tmp_path: Path
) -> None:
    from tenants.models import Tenant

    Tenant.objects.filter(pk=org.acme.pk).update(allowed_registries=["nvcr.io/nvidia"])
    code, _, err = submit_json(logged_in, org, tmp_path, job_spec())
    assert code == 1
    assert "spec.image: 'registry.example.com/nlp/bert:1.2'" in err and "nvcr.io/nvidia" in err
    assert Job.objects.count() == 0


def test_an_unknown_pool_is_refused_naming_the_known_ones(
    logged_in: Any, org: Org, tmp_path: Path
) -> None:
    from tests import factories as f

    f.NodeFactory(name="spot-1", pool="spot")
    code, _, err = submit_json(logged_in, org, tmp_path, job_spec(pools=["nope"]))
    assert code == 1
    assert "spec.pools: unknown pool 'nope'; known pools" in err and "): spot." in err
    assert Job.objects.count() == 0


def test_a_spec_file_giving_a_key_twice_is_refused_before_anything_is_sent(
    logged_in: Any, org: Org, tmp_path: Path
) -> None:
    # YAML's reading kept the last (A=2, silently), where the API refuses a JSON body that
    # repeats a key
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(
        "name: twice\ntype: training\nimage: registry.example.com/nlp/bert:1.2\n"
        "command: [python, train.py]\nresources: {gpus: 1}\n"
        "env:\n  A: '1'\n  A: '2'\n"
    )
    code, _, err = logged_in("submit", str(spec_file), "--project", "proj-alpha")
    assert code == 2, err
    assert "cannot read the spec" in err and "'A' is given twice (lines 7 and 8)" in err
    assert Job.objects.count() == 0
    # keys alike in different mappings, and YAML's merge key, are no repeats
    assert load_yaml("a: {x: 1}\nb: {x: 2}\nbase: &b {y: 1}\nc: {<<: *b, z: 2}\n") == {
        "a": {"x": 1},
        "b": {"x": 2},
        "base": {"y": 1},
        "c": {"y": 1, "z": 2},
    }


def test_other_teams_job_is_not_found(logged_in: Any, org: Org) -> None:
    from tests import factories as f

    theirs = f.JobFactory(project=org.proj_bravo, submitted_by=org.users["bob-bravo"])
    code, _, err = logged_in("job", str(theirs.pk))
    assert code == 1 and "HTTP 404" in err


def test_unreadable_spec_and_unknown_project_are_usage_errors(
    logged_in: Any, org: Org, tmp_path: Path
) -> None:
    code, _, err = logged_in("submit", str(tmp_path / "missing.yaml"), "--project", "1")
    assert code == 2 and "cannot read the spec" in err
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(job_spec()))
    code, _, err = logged_in("submit", str(spec_file), "--project", "proj-bravo")
    assert code == 2 and "no single project" in err


def test_unreachable_server_exits_3(gantry: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANTRY_URL", "http://127.0.0.1:9")  # discard port: refused at once
    monkeypatch.setattr("cli.client.sleep", lambda s: None)
    code, _, err = gantry("whoami")
    assert code == 3 and "cannot reach" in err


class _CutMidBody(socketserver.BaseRequestHandler):
    """Answers 200 with a body shorter than its Content-Length, then closes (a proxy that
    restarts mid-answer)."""

    def handle(self) -> None:
        self.request.recv(65536)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        self.request.sendall(head + b'{"lines": [')
        self.request.close()


def test_an_answer_cut_mid_body_exits_3_not_a_traceback(
    gantry: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _CutMidBody)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("GANTRY_URL", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("GANTRY_TOKEN", "token")
        monkeypatch.setattr("cli.client.sleep", lambda s: None)
        code, _, err = gantry("logs", "1")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 3 and "cannot reach" in err and "IncompleteRead" in err


def test_table_output_strips_terminal_escapes() -> None:
    from cli.main import table

    out = io.StringIO()
    table([{"name": "evil\x1b[2Jname"}], ["name"], out)
    assert "\x1b" not in out.getvalue()
    assert "evil?[2Jname" in out.getvalue()


def test_error_paths_are_flattened() -> None:
    errors = {"spec": {"resources": {"gpus": ["bad"]}, "name": ["worse"]}}
    assert list(_flatten(errors)) == [("spec.resources.gpus", "bad"), ("spec.name", "worse")]


def test_an_expired_token_says_so_and_rotation_renews_it(logged_in: Any, org: Org) -> None:
    """Tokens expire (issue 34, item 8): the CLI says so and how to get a new one;
    `gantry rotate-token` saves a fresh one and the old one stops working."""
    import datetime as dt

    from django.utils import timezone
    from rest_framework.authtoken.models import Token

    old = Token.objects.get(user=org.users["alice"]).key
    assert logged_in("rotate-token")[0] == 0
    assert Token.objects.get(user=org.users["alice"]).key != old
    assert logged_in("whoami")[0] == 0  # with the new token saved
    Token.objects.filter(user=org.users["alice"]).update(
        created=timezone.now() - dt.timedelta(days=31)
    )
    code, _, err = logged_in("whoami")
    assert code == 1
    assert "HTTP 401: This API token expired on" in err
    assert "run `gantry login USERNAME` for a new one" in err


def test_a_job_created_in_kubernetes_is_listed_apart_and_shown_with_its_object(
    logged_in: Any, org: Org
) -> None:
    from tests import factories as f

    workload = {"apiVersion": "batch/v1", "kind": "Job", "namespace": "alpha", "name": "ddp"}
    native = f.JobFactory(
        project=org.proj_alpha,
        submitted_by=org.users["alice"],
        spec={**job_spec(), "workload": {**workload, "uid": "u-1"}},
    )
    ours = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    code, out, err = logged_in("--json", "jobs", "--origin", "kubernetes")
    assert code == 0, err
    assert [j["id"] for j in json.loads(out)] == [native.pk]
    code, out, _ = logged_in("--json", "jobs", "--origin", "gantry")
    assert [j["id"] for j in json.loads(out)] == [ours.pk]
    code, out, _ = logged_in("job", str(native.pk))
    assert "Kubernetes Job alpha/ddp" in out
