"""The pinned releases and where their binaries are cached."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GO_MODULES = ROOT / "platform" / "dev" / "go"

KUBERNETES = "v1.37.2"  # k8s.io/kubernetes; its staging modules at the matching v0.37.2
ETCD = "v3.7.3"  # go.etcd.io/etcd/server/v3
KUEUE = "v0.17.0"  # sigs.k8s.io/kueue, the peer in bench/k8s_kueue.py (its own k8s libs v0.35)

# The workload kinds Gantry queues from Kubernetes (issue 37): their CRDs come from these Go
# modules (devcluster/crds.py), at the releases Kueue v0.17.0 integrates with (its go.mod).
JOBSET = "v0.11.1"  # sigs.k8s.io/jobset
LWS = "v0.8.0"  # sigs.k8s.io/lws
TRAINER = "v2.2.0"  # github.com/kubeflow/trainer/v2 (TrainJob)
TRAINING_OPERATOR = "v1.9.3"  # github.com/kubeflow/training-operator (PyTorchJob)
KUBERAY = "v1.6.0"  # github.com/ray-project/kuberay/ray-operator (RayJob)

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
    # The workload kinds' controller managers (devcluster/controllers.py).
    "jobset": (JOBSET, {"jobset": "sigs.k8s.io/jobset"}),
    "lws": (LWS, {"lws": "sigs.k8s.io/lws/cmd"}),
}
# Built only when asked (`python -m devcluster build --peers`, `make control-plane-peers`): the
# control plane and its tests do not need them, and Kueue's cold build would add its own minutes.
PEERS = frozenset({"kueue", "jobset", "lws"})


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
