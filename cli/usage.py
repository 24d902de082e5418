"""What the commands raise for bad arguments or unreadable input (exit 2), and how they look
names up (a flavor, a cluster, a tenant by slug) before they call the API."""

from __future__ import annotations

from typing import Any

from cli.client import Client


class UsageError(Exception):
    """Bad arguments or an unreadable spec file (exit 2)."""


def flavor_id(client: Client, name: str) -> int:
    found = client.get("/api/v1/flavors/", name=name)["results"]
    if len(found) != 1:
        raise UsageError(f"no GPU model named {name!r}; see `gantry quotas` for those in use.")
    return int(found[0]["id"])


def cluster_id(client: Client, name: str) -> int:
    for cluster in client.pages("/api/v1/clusters/"):
        if cluster["name"] == name:
            return int(cluster["id"])
    raise UsageError(f"no cluster named {name!r} that you may see; see `gantry clusters`.")


def tenant_id(client: Client, tenant: str | None) -> int:
    """A tenant by id or slug; none given: the one tenant you administer."""
    if tenant is not None and tenant.isdigit():
        return int(tenant)
    if tenant is not None:
        found = [t for t in client.pages("/api/v1/tenants/") if t["slug"] == tenant]
        if len(found) != 1:
            raise UsageError(f"no tenant {tenant!r} that you may see.")
        return int(found[0]["id"])
    me: dict[str, Any] = client.get("/api/v1/me/")
    admin = sorted({m["tenant"] for m in me["memberships"] if m["role"] == "admin"})
    if len(admin) != 1:
        where = "no tenant" if not admin else f"{len(admin)} tenants"
        raise UsageError(f"you administer {where}: name the tenant with --tenant SLUG.")
    return int(admin[0])
