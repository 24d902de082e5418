"""The scheduling profile's file: read strictly, reloaded between cycles without a restart,
a bad new content refused (the profile in force kept), recorded and audited."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from bench.bench_profile import PROFILES_DIR, bench_profile
from scheduler.core import Profile, ProfileError
from scheduler.daemon import loop as daemon_module
from scheduler.models import SchedulingProfileRecord
from scheduler.profiles.files import ProfileWatch, parse_profile, read_profile
from scheduler.profiles.record import profile_record_loaded, profile_record_refused
from tenants.models import AuditEntry
from tests.daemon.conftest import Env, expire_leases

HEADER = "apiVersion: gantry.io/v1\nkind: SchedulingProfile\n"


def write(path: Path, body: str, *, mtime_ns: int) -> Path:
    """Write a profile file with a given modification time (no waiting for the clock)."""
    path.write_text(HEADER + body)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


BAD_FILES = [
    ("yaml-syntax", "name: [unclosed\n", "line 4, column 1", "not valid YAML"),
    ("key-given-twice", "name: a\nname: b\n", "name", "given twice (line 4)"),
    ("no-header", None, "apiVersion", "missing; expected 'gantry.io/v1'"),
    ("bad-value", "preemption:\n  min_runtime_s: -5\n", "preemption.min_runtime_s", "got -5"),
    ("unknown-key", "preemption:\n  min_runtime: 0\n", "preemption.min_runtime", "unknown key"),
]


@pytest.mark.parametrize(
    ("body", "key", "message"), [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES]
)
def test_a_profile_file_is_read_strictly(body: str | None, key: str, message: str) -> None:
    text = "name: x\n" if body is None else HEADER + body
    with pytest.raises(ProfileError) as info:
        parse_profile(text.encode())
    found = dict(info.value.errors)
    assert key in found, found
    assert message in found[key], found


def test_every_problem_of_a_file_is_reported_together() -> None:
    text = "kind: SchedulingProfile\nplugins:\n  score: {Magic: 1}\nbackfill: {enabled: 'yes'}\n"
    with pytest.raises(ProfileError) as info:
        parse_profile(text.encode())
    assert [key for key, _ in info.value.errors] == [
        "apiVersion",
        "plugins.score.Magic",
        "backfill.enabled",
    ]


@pytest.fixture
def recorded(env: Env, tmp_path: Path) -> dict[str, Any]:
    """A profile file, a watch on the daemon's clock that records as run_scheduler's does,
    and the profiles handed to the engine, cycle by cycle."""
    path = write(tmp_path / "profile.yaml", "name: patient\n", mtime_ns=1_000_000_000)
    watch = ProfileWatch(
        path,
        on_loaded=lambda loaded: profile_record_loaded(loaded=loaded, holder="daemon-0"),
        on_refused=lambda p, sha, errors: profile_record_refused(path=p, sha256=sha, errors=errors),
        clock=env.clock,
        every_s=1.0,
    )
    return {"path": path, "watch": watch, "seen": []}


@pytest.fixture
def engine_sees(monkeypatch: pytest.MonkeyPatch, recorded: dict[str, Any]) -> list[Profile]:
    seen: list[Profile] = recorded["seen"]
    real = daemon_module.run_cycle

    def spy(snapshot: Any, profile: Profile, **kwargs: Any) -> Any:
        seen.append(profile)
        return real(snapshot, profile, **kwargs)

    monkeypatch.setattr(daemon_module, "run_cycle", spy)
    return seen


def test_the_daemon_picks_up_a_changed_profile_without_a_restart(
    env: Env, recorded: dict[str, Any], engine_sees: list[Profile]
) -> None:
    daemon = env.daemon(profile_watch=recorded["watch"])
    env.run(daemon)
    assert engine_sees[-1].name == "patient" and engine_sees[-1].min_runtime_s == 300.0
    write(recorded["path"], "name: eager\npreemption: {min_runtime_s: 0}\n", mtime_ns=2 * 10**9)
    env.run(daemon, seconds=1.0)
    assert engine_sees[-1].name == "eager" and engine_sees[-1].min_runtime_s == 0.0
    row = SchedulingProfileRecord.objects.get()
    assert (row.name, row.path, row.loaded_by) == ("eager", str(recorded["path"]), "daemon-0")
    assert row.sha256 == read_profile(recorded["path"]).sha256
    assert row.document["preemption"]["min_runtime_s"] == 0.0
    # audited: the first profile recorded, then the change, with the settings before/after
    entries = list(AuditEntry.objects.filter(action="scheduler.profile").order_by("pk"))
    assert len(entries) == 2
    assert entries[0].before is None
    assert entries[1].before["document"]["name"] == "patient"
    assert entries[1].after["document"]["name"] == "eager"


def test_a_file_touched_but_unchanged_is_not_a_change(
    env: Env, recorded: dict[str, Any], engine_sees: list[Profile]
) -> None:
    daemon = env.daemon(profile_watch=recorded["watch"])
    env.run(daemon)
    write(recorded["path"], "name: patient\n", mtime_ns=2 * 10**9)  # same content, new mtime
    env.run(daemon, seconds=1.0)
    assert AuditEntry.objects.filter(action="scheduler.profile").count() == 1


def test_a_bad_new_profile_is_refused_and_the_profile_in_force_kept(
    env: Env,
    recorded: dict[str, Any],
    engine_sees: list[Profile],
    caplog: pytest.LogCaptureFixture,
) -> None:
    daemon = env.daemon(profile_watch=recorded["watch"])
    env.run(daemon)
    write(recorded["path"], "preemption: {min_runtime_s: -1}\n", mtime_ns=2 * 10**9)
    with caplog.at_level(logging.ERROR, logger="gantry.profile"):
        env.run(daemon, seconds=1.0, cycles=3)
    assert [p.name for p in engine_sees] == ["patient"] * 4
    row = SchedulingProfileRecord.objects.get()
    assert row.name == "patient" and row.refused_at is not None
    assert row.refused_errors == [
        {"key": "preemption.min_runtime_s", "message": "must be >= 0, got -1"}
    ]
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1  # once per bad content, not every cycle
    assert "preemption.min_runtime_s: must be >= 0, got -1" in refusals[0].getMessage()
    assert AuditEntry.objects.filter(action="scheduler.profile").count() == 1
    # mended: loaded, and the refusal is cleared
    write(recorded["path"], "name: mended\n", mtime_ns=3 * 10**9)
    env.run(daemon, seconds=1.0)
    assert engine_sees[-1].name == "mended"
    row.refresh_from_db()
    assert (row.name, row.refused_errors, row.refused_at) == ("mended", [], None)


def test_a_new_leader_records_the_profile_it_runs(env: Env, tmp_path: Path) -> None:
    def watch(name: str) -> ProfileWatch:
        path = write(tmp_path / f"{name}.yaml", f"name: {name}\n", mtime_ns=10**9)
        return ProfileWatch(
            path,
            on_loaded=lambda loaded: profile_record_loaded(loaded=loaded, holder=name),
            clock=env.clock,
        )

    first = env.daemon("first", profile_watch=watch("first"))
    env.run(first)
    assert SchedulingProfileRecord.objects.get().loaded_by == "first"
    expire_leases()
    second = env.daemon("second", profile_watch=watch("second"))
    env.run(second)
    row = SchedulingProfileRecord.objects.get()
    assert (row.name, row.loaded_by) == ("second", "second")
    assert AuditEntry.objects.filter(action="scheduler.profile").count() == 2


def test_run_scheduler_refuses_to_start_on_a_bad_profile(
    db: Any, tmp_path: Path, settings: Any
) -> None:
    bad = write(tmp_path / "bad.yaml", "fair_share: {half_life_s: 0}\nquantum: 1\n", mtime_ns=1)
    with pytest.raises(CommandError) as info:
        call_command("run_scheduler", "--profile", str(bad), "--no-demo-load")
    assert "fair_share.half_life_s: must be > 0, got 0" in str(info.value)
    assert "quantum: unknown key" in str(info.value)
    # the setting selects the file when --profile is not given
    settings.GANTRY_SCHEDULER_PROFILE = str(tmp_path / "missing.yaml")
    with pytest.raises(CommandError, match=r"missing\.yaml: cannot be read"):
        call_command("run_scheduler", "--no-demo-load")
    assert not SchedulingProfileRecord.objects.exists()


def test_the_benchmarks_profiles_load_through_the_same_reader() -> None:
    # every file under bench/profiles/ is a valid profile; the Kueue scenarios' one lets any
    # job be preempted at once, as the hand-built Profile(min_runtime_s=0.0) they replaced
    files = sorted(PROFILES_DIR.glob("*.yaml"))
    assert {f.stem for f in files} >= {"default", "no-min-runtime", "bestfit"}
    for path in files:
        assert read_profile(path).profile.name == path.stem
    assert bench_profile("default").profile == Profile()
    assert bench_profile("no-min-runtime").profile == Profile(
        name="no-min-runtime", min_runtime_s=0.0
    )
    assert bench_profile("bestfit").profile.score_weights == {"GpuFit": 1.0}


def test_the_readmes_example_profile_is_valid() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## The scheduling profile", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    profile = parse_profile(example.encode())
    assert (profile.name, profile.min_runtime_s, profile.half_life_s) == (
        "research-cluster",
        600.0,
        43200.0,
    )
