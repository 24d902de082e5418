"""When the real-cluster tests run, skip or fail (tests/k8s/real_plane.py); no plane needed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.k8s import real_plane


@dataclass
class Item:
    name: str
    markers: set[str] = field(default_factory=set)
    fixturenames: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


@dataclass
class Hook:
    deselected: list[Any] = field(default_factory=list)

    def pytest_deselected(self, items: list[Any]) -> None:
        self.deselected.extend(items)


@dataclass
class Config:
    hook: Hook = field(default_factory=Hook)


ITEMS = (
    Item("real, no database", {"kubernetes"}),
    Item("real, database marker", {"kubernetes", "django_db"}),
    Item("real, db fixture", {"kubernetes"}, ("db",)),
    Item("fake", set(), ("db",)),
    Item("backend-independent", {"backend_independent"}),
)


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        ("", [i.name for i in ITEMS]),
        ("required", [i.name for i in ITEMS]),
        ("db-only", ["real, database marker", "real, db fixture", "fake"]),
        ("skip", ["fake", "backend-independent"]),
    ],
    ids=["unset", "required", "db-only", "skip"],
)
def test_deselect_leaves_the_real_cluster_tests_this_pass_must_not_run(
    monkeypatch: pytest.MonkeyPatch, mode: str, kept: list[str]
) -> None:
    monkeypatch.setenv(real_plane.MODE_ENV, mode)
    items, config = list(ITEMS), Config()
    real_plane.deselect(items, config)
    assert [i.name for i in items] == kept
    assert sorted(i.name for i in config.hook.deselected) == sorted(
        i.name for i in ITEMS if i.name not in kept
    )


@pytest.mark.parametrize("mode", ["db-only", "skip"])
def test_a_backend_independent_test_that_uses_the_database_is_an_error(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv(real_plane.MODE_ENV, mode)
    items = [Item("marked, db fixture", {"backend_independent"}, ("db",))]
    with pytest.raises(pytest.UsageError, match="backend_independent, but uses the database"):
        real_plane.deselect(items, Config())


@pytest.fixture
def no_binaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GANTRY_CONTROL_PLANE_CACHE", str(tmp_path / "empty"))


def test_without_binaries_the_real_tests_skip_saying_how_to_build(
    no_binaries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(real_plane.MODE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="make control-plane"):
        real_plane.require_binaries()


def test_without_binaries_a_required_run_fails(
    no_binaries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(real_plane.MODE_ENV, "required")
    with pytest.raises(pytest.fail.Exception, match="GANTRY_K8S_REAL=required but"):
        real_plane.require_binaries()
