"""Cluster backends behind one Protocol (`scheduler.backends.base.ClusterBackend`)."""
