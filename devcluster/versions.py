"""The pinned releases and where their binaries are cached."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GO_MODULES = ROOT / "platform" / "dev" / "go"

KUBERNETES = "v1.37.2"  # k8s.io/kubernetes; its staging modules at the matching v0.37.2
ETCD = "v3.7.3"  # go.etcd.io/etcd/server/v3
KUEUE = "v0.17.0"  # sigs.k8s.io/kueue, the peer in bench/k8s_kueue.py (its own k8s libs v0.35)

# What each Go module under platform/dev/go builds, and the release that names its cache.
COMMANDS = {
    "kubernetes": (
        KUBERNETES,
        {
            "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
            "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
            "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
        },
    ),
    "etcd": (ETCD, {"etcd": "."}),
    "kueue": (
        KUEUE,
        # versionproxy: the plane's API server has no version stamp, which Kueue refuses.
        {"kueue": "sigs.k8s.io/kueue/cmd/kueue", "versionproxy": "./versionproxy"},
    ),
}
# Built only when asked (`python -m devcluster build --peers`, `make control-plane-peers`): the
# control plane and its tests do not need them, and Kueue's cold build would add its own minutes.
PEERS = frozenset({"kueue"})


def cache_dir() -> Path:
    """Binaries live outside the clone, so that a fresh clone on the same machine reuses them."""
    configured = os.environ.get("GANTRY_CONTROL_PLANE_CACHE")
    if configured:
        return Path(configured)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "gantry" / "control-plane"


def binary(name: str) -> Path:
    for module, (release, commands) in COMMANDS.items():
        if name in commands:
            return cache_dir() / f"{module}-{release}" / name
    raise KeyError(name)
