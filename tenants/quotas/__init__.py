"""Quotas: the rules a quota obeys against its parent and children (rules) and quotas pinned
to a cluster (pins)."""
