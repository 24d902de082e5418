"""Build the control plane's binaries from the Go module proxy, once per release.

The first build compiles a few thousand packages and takes many minutes on a small machine, so
it reports progress as it goes. A second run finds the binaries in the cache and builds nothing.
Concurrent runs (two test workers, CI and a developer) serialise on a lock file, and a build
that dies half-way leaves only a `.partial` folder that the next run discards.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from devcluster.versions import COMMANDS, GO_MODULES, PEERS, cache_dir

Say = Callable[[str], None]
PROGRESS_EVERY_S = 20.0


def _say(message: str) -> None:
    print(f"control-plane: {message}", file=sys.stderr, flush=True)


def missing(*, peers: bool = False) -> list[str]:
    """The modules whose binaries are not all cached (the peers' too when asked)."""
    return [
        module
        for module, (release, commands) in COMMANDS.items()
        if (peers or module not in PEERS)
        and not all((cache_dir() / f"{module}-{release}" / name).is_file() for name in commands)
    ]


def build_all(say: Say = _say, *, peers: bool = False) -> None:
    if not missing(peers=peers):
        say(f"binaries cached in {cache_dir()}")
        return
    if shutil.which("go") is None:
        raise SystemExit("control-plane: the Go toolchain is missing (install Go 1.26 or newer)")
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build may finish what we came to do
        for module in missing(peers=peers):
            _build(module, say)


def _name_binary(folder: Path, name: str, package: str) -> None:
    """Give the binary built for `package` its command's `name`: go names it for the
    package's folder (sigs.k8s.io/jobset -> jobset, ./versionproxy -> versionproxy), and for
    the module's own package (".") for the module, which is already the name wanted."""
    wanted = folder / name
    if wanted.is_file():
        return
    built = folder / PurePosixPath(package).name  # "." names nothing: the folder itself
    if not built.is_file():
        raise SystemExit(f"control-plane: go built no binary named {name} for {package}")
    built.rename(wanted)


def _build(module: str, say: Say) -> None:
    release, commands = COMMANDS[module]
    target = cache_dir() / f"{module}-{release}"
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    started = time.monotonic()
    say(
        f"building {', '.join(commands)} {release} from the Go module proxy "
        "(the first build takes 10-30 minutes on two cores; later runs reuse the cache)"
    )
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    command = ["go", "build", "-v", "-trimpath", "-o", str(partial) + "/", *commands.values()]
    process = subprocess.Popen(
        command,
        cwd=GO_MODULES / module,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    compiled = 0
    tail: list[str] = []
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            minutes = (time.monotonic() - started) / 60
            say(f"  {module}: {compiled} packages compiled, {minutes:.1f} min so far")

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    assert process.stdout is not None
    with process.stdout:
        for line in process.stdout:
            compiled += 1
            tail = [*tail[-30:], line.rstrip()]
    code = process.wait()
    done.set()
    if code != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise SystemExit(f"control-plane: go build failed ({code}):\n" + "\n".join(tail))
    for name, package in commands.items():
        _name_binary(partial, name, package)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    say(f"built {module} {release} in {(time.monotonic() - started) / 60:.1f} min -> {target}")
