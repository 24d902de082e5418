"""The peers' builds (Kueue) are opt-in: the control plane's own `build` and `up` never wait
for them, and `build --peers` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster import build
from devcluster.versions import COMMANDS, PEERS


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GANTRY_CONTROL_PLANE_CACHE", str(tmp_path))
    for module, (release, commands) in COMMANDS.items():
        if module in PEERS:
            continue
        (tmp_path / f"{module}-{release}").mkdir()
        for name in commands:
            (tmp_path / f"{module}-{release}" / name).write_bytes(b"")
    return tmp_path


def test_the_plane_is_complete_without_the_peers(cache: Path) -> None:
    assert build.missing() == []
    assert sorted(build.missing(peers=True)) == sorted(PEERS)


def test_build_all_does_not_build_a_missing_peer_unless_asked(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []
    monkeypatch.setattr(build, "_build", lambda module, say: built.append(module))
    monkeypatch.setattr(build.shutil, "which", lambda name: "/usr/bin/go")
    build.build_all(say=lambda message: None)
    assert built == []
    build.build_all(say=lambda message: None, peers=True)
    assert sorted(built) == sorted(PEERS) == ["jobset", "kueue", "lws"]


@pytest.mark.parametrize(
    ("package", "built_as"),
    [
        (".", "etcd"),  # the module's own main package: go names it for the go.mod's module
        ("sigs.k8s.io/jobset", "jobset"),  # named for the package's folder, renamed
        ("./versionproxy", "versionproxy"),
    ],
)
def test_each_binary_gets_its_commands_name(tmp_path: Path, package: str, built_as: str) -> None:
    """A fresh machine's build stopped at etcd (2026-12-07): its package "." resolved to the
    build folder itself, which was then renamed into itself (OSError: Invalid argument)."""
    (tmp_path / built_as).write_bytes(b"\x7fELF")
    name = "etcd" if package == "." else "the-command"
    build._name_binary(tmp_path, name, package)
    assert (tmp_path / name).read_bytes() == b"\x7fELF"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_binary_go_did_not_build_is_said(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no binary named kueue"):
        build._name_binary(tmp_path, "kueue", "sigs.k8s.io/kueue/cmd/kueue")


def test_a_module_whose_command_is_its_own_package_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """etcd's build, end to end with a `go` that writes its binary as go does (for ".", named
    for the module): cached under the release, the partial folder gone."""
    fake = tmp_path / "bin" / "go"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\n'
        'echo go.etcd.io/etcd/server/v3\nprintf ELF > "$2/etcd"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setenv("GANTRY_CONTROL_PLANE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "modules" / "etcd").mkdir(parents=True)
    monkeypatch.setattr(build, "GO_MODULES", tmp_path / "modules")
    monkeypatch.setitem(build.COMMANDS, "etcd", ("v9.9.9", {"etcd": "."}))
    (tmp_path / "cache").mkdir()
    build._build("etcd", lambda message: None)
    assert (tmp_path / "cache" / "etcd-v9.9.9" / "etcd").read_text() == "ELF"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["etcd-v9.9.9"]
