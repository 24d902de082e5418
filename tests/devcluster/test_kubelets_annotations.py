"""How long a simulated pod runs and how it exits, read from its annotations (as KWOK's stage
annotations do): what lets a Job's pods, made by its controller, end by themselves."""

from __future__ import annotations

import pytest

from devcluster.kubelets import EXIT_CODE, RUN_SECONDS, annotated_duration, annotated_exit_code


def pod(**annotations: str) -> dict[str, object]:
    return {"metadata": {"name": "p", "annotations": annotations}}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param(None, None, id="none: runs until told"),
        pytest.param("0", 0.0, id="zero: exits on the next pass"),
        pytest.param("2.5", 2.5, id="fractional"),
        pytest.param("-1", None, id="negative: ignored"),
        pytest.param("soon", None, id="not a number: ignored"),
    ],
)
def test_run_seconds(value: str | None, seconds: float | None) -> None:
    annotations = {} if value is None else {RUN_SECONDS: value}
    assert annotated_duration(pod(**annotations)) == seconds


@pytest.mark.parametrize(
    ("value", "code"),
    [
        pytest.param(None, 0, id="none: success"),
        pytest.param("3", 3, id="a code"),
        pytest.param("oops", 1, id="not a number: a failure"),
    ],
)
def test_exit_code(value: str | None, code: int) -> None:
    annotations = {} if value is None else {EXIT_CODE: value}
    assert annotated_exit_code(pod(**annotations)) == code


def test_a_pod_without_annotations_at_all() -> None:
    bare = {"metadata": {"name": "p"}}
    assert annotated_duration(bare) is None and annotated_exit_code(bare) == 0
