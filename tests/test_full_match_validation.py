"""Validation matches the whole value (issue 17, point 8): in Python, `$` also matches before
a trailing newline, so `^NAME$` took "NAME\\n". An environment variable named "FOO\\n" passed
the job spec, was refused by the API server at bind, and the bind was retried forever. Every
validating regex ends in `\\Z`; a scan keeps the family from coming back.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework import serializers

from common.text import validate_dns_label
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.kubernetes.inventory import _memory_from_product
from scheduler.backends.kubernetes.render import UnsafePodSpec, render_pod
from scheduler.jobs.spec import JobSpecSerializer
from scheduler.models import Job
from tests.conftest import Org, job_spec
from tests.k8s.builders import make_request

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "common", "tenants", "scheduler", "billing", "portal", "cli")


def spec_method(name: str) -> Callable[[Any], Any]:
    return getattr(JobSpecSerializer(), name)


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (validate_dns_label, "team-alpha\n"),
        (spec_method("validate_name"), "bert\n"),
        (spec_method("validate_image"), "pytorch/pytorch:2.4\n"),
        (spec_method("validate_env"), {"FOO\n": "1"}),
        (spec_method("validate_pools"), ["default\n"]),
    ],
    ids=["dns-label", "job-name", "image", "env-name", "pool"],
)
def test_a_trailing_newline_is_refused(check: Callable[[Any], Any], value: Any) -> None:
    with pytest.raises((ValidationError, serializers.ValidationError)):
        check(value)
    clean = value.rstrip("\n") if isinstance(value, str) else None
    if clean is not None:  # the same value without the newline passes
        check(clean)


def test_a_job_with_an_env_name_ending_in_a_newline_is_refused_at_submit(
    org: Org, client_for: Any
) -> None:
    body = {"project": org.proj_alpha.pk, "spec": job_spec(env={"FOO\n": "1"})}
    response = client_for("alice").post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert "env" in response.json()["errors"]["spec"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "changes",
    [
        {"env": {"FOO\n": "1"}},
        {"namespace": "proj-alpha\n"},
        {"priority_class": "normal\n"},
        {"mig_profile": "1g.10gb\n", "gpu_milli": 0},
    ],
    ids=["env-name", "namespace", "priority-class", "mig-profile"],
)
def test_the_pod_renderer_refuses_a_trailing_newline(changes: dict[str, Any]) -> None:
    with pytest.raises(UnsafePodSpec):
        render_pod(make_request(**changes), KubernetesConfig())


def test_node_labels_with_a_trailing_newline_are_not_parsed_as_tokens() -> None:
    assert _memory_from_product("NVIDIA-H100-80GB\n") == 0
    assert _memory_from_product("NVIDIA-H100-80GB") == 80 * 1024


# A string literal that ends a regex with `$`: `r"...$"` or `"...$"`.
DOLLAR_END = re.compile(r"""[rR]?(["'])(?:[^"'\\\n]|\\.)*\$\1""")


def test_no_regex_in_the_project_ends_with_a_dollar() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        # an OpenAPI "pattern" is ECMA-262, where $ ends the text (no newline before it)
        if DOLLAR_END.search(line) and '"pattern":' not in line
    ]
    assert not offenders, f"use \\Z (or fullmatch), not $: {offenders}"
