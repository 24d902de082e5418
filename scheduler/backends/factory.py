"""The cluster backend a web or API process reads pod logs through, from the settings the
daemon uses (GANTRY_CLUSTER_BACKEND, and for Kubernetes the same credentials and GANTRY_K8S_*
variables through `kubernetes.from_environment`, as `run_scheduler` builds it).

The simulated cluster's logs are a function of the job (simulated_logs), so the web process
needs no simulated cluster of its own. One backend per process: building the Kubernetes
client reads the kubeconfig or the service account once.
"""

from __future__ import annotations

import functools

from django.conf import settings

from scheduler.backends.base import BackendError, LogSource


@functools.cache
def _log_source(kind: str) -> LogSource:
    if kind == "kubernetes":
        from kubernetes.config import ConfigException

        from scheduler.backends.kubernetes.backend import from_environment

        try:
            return from_environment()
        except (ConfigException, OSError) as exc:  # not cached: tried again on the next read
            raise BackendError(f"the cluster's credentials could not be loaded: {exc}") from exc
    if kind == "simulated":
        from scheduler.backends.simulated.logs import SimulatedLogs

        return SimulatedLogs()
    raise ValueError(f"unknown backend {kind!r} (simulated or kubernetes)")


def log_source() -> LogSource:
    """The LogSource of GANTRY_CLUSTER_BACKEND (built once per process). Raises BackendError
    when the Kubernetes credentials cannot be loaded (the API answers 503, the page says so)."""
    return _log_source(settings.GANTRY_CLUSTER_BACKEND)
