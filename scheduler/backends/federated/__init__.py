"""Several clusters behind the one backend contract (docs/multicluster.md): `federate` builds
a `FederatedBackend` over `{cluster: backend}` with the capabilities its members offer."""

from scheduler.backends.federated.backend import FederatedBackend, Member, federate

__all__ = ["FederatedBackend", "Member", "federate"]
