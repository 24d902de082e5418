"""Which container registries a tenant's jobs may pull from.

A tenant's `allowed_registries` lists registry hosts or host/path prefixes
(`registry.example.com`, `nvcr.io/nvidia`, `docker.io/pytorch`); an empty list follows the
tenant above. Every list set on the way from the root down to a job's tenant applies: an image
must be allowed by each of them, so a list set higher up binds the whole subtree even where a
list below was written before the higher one was narrowed. A list may only narrow the lists
above it (each entry lies inside an entry of each), and an organisation with no list up its
tree allows every registry: the platform's existing jobs and the embedded demo keep running
until a platform admin narrows an organisation (README "Allowed registries").

The lists are set from above, as quotas are (`access.can_set_quota`): an admin of a strict
ancestor, or a platform admin. A tenant's own admin could otherwise remove a list that binds
their team (an empty list widens it to the parent's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from common.db.shared_reads import shared
from tenants import access
from tenants.audit import audit_record
from tenants.models import Tenant

DOCKER_HUB = "docker.io"
# Docker's other spellings of Docker Hub, read as docker.io (distribution/reference).
HUB_ALIASES = frozenset({"index.docker.io", "registry-1.docker.io"})
MAX_ENTRIES = 64
_HOST = r"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
ENTRY_RE = re.compile(rf"(?:{_HOST})(?:/{_COMPONENT})*\Z")


@dataclass(frozen=True)
class ImageName:
    """An image reference as Docker reads it: `host` is the registry, `path` the repository
    within it; the tag and digest play no part in where it is pulled from."""

    host: str
    path: str

    @property
    def repository(self) -> str:
        return f"{self.host}/{self.path}"


def _is_host(component: str) -> bool:
    # Docker's rule (distribution/reference splitDockerDomain): the first component names a
    # registry when it holds a dot or a port, or is localhost; otherwise it is Docker Hub's.
    return "." in component or ":" in component or component == "localhost"


def image_name(reference: str) -> ImageName:
    """Normalise an image reference the way Docker does: `ubuntu` is
    docker.io/library/ubuntu, `pytorch/pytorch:2.4` docker.io/pytorch/pytorch, a digest
    (`@sha256:...`) and a tag are dropped, a registry's port is kept (`localhost:5000/x`).

    The caller passes a reference the job spec has already checked (scheduler.jobs.spec.IMAGE_RE).
    """
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:  # a tag: a colon after the last slash (a port's comes before it)
        name = name[: len(name) - len(last[-1]) + last[-1].index(":")]
    first, _, rest = name.partition("/")
    if rest and _is_host(first):
        host, path = first.lower(), rest
    else:
        host, path = DOCKER_HUB, name
    if host in HUB_ALIASES:
        host = DOCKER_HUB
    if host == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return ImageName(host, path)


def entry_normalise(entry: str) -> str:
    """An allow-list entry in the form images are matched against: a registry host first
    (`nvcr.io/nvidia`, `docker.io/pytorch`), Docker Hub's aliases read as docker.io, no
    trailing slash. ValueError names what is wrong."""
    text = entry.strip().rstrip("/")
    first, _, rest = text.partition("/")
    first = first.lower()
    if not _is_host(first):
        raise ValueError(
            f"{entry[:80]!r} does not start with a registry host (e.g. {_on_docker_hub(text)} "
            "or registry.example.com)."
        )
    if "@" in text or ":" in rest:
        raise ValueError(f"{entry[:80]!r} names a tag or digest; list registries or paths.")
    text = "/".join([DOCKER_HUB if first in HUB_ALIASES else first, *([rest] if rest else [])])
    if not ENTRY_RE.match(text):
        raise ValueError(f"{entry[:80]!r} is not a registry host or host/path prefix.")
    return text


def _on_docker_hub(text: str) -> str:
    """An example entry for `text` that names no host: `text` on Docker Hub where that is
    an entry (pytorch -> docker.io/pytorch), else a Docker Hub entry that is one."""
    example = f"{DOCKER_HUB}/{text}"
    return example if len(text) <= 40 and ENTRY_RE.match(example) else f"{DOCKER_HUB}/pytorch"


def allows(entry: str, image: ImageName) -> bool:
    """True when `image` lies under `entry`, on a path boundary: nvcr.io/nvidia allows
    nvcr.io/nvidia/pytorch, not nvcr.io/nvidiaevil/x."""
    repository = image.repository
    return repository == entry or repository.startswith(entry + "/")


def _covers(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer + "/")


@shared
def chain_lists(tenant: Tenant) -> list[tuple[Tenant, list[str]]]:
    """The lists set on the way from the root down to `tenant` (itself included), root first;
    one query."""
    ids = tenant.ancestor_ids()
    rows = {t.pk: t for t in Tenant.objects.filter(pk__in=ids).only("slug", "allowed_registries")}
    return [(rows[i], rows[i].allowed_registries) for i in ids if rows[i].allowed_registries]


def effective_registries(tenant: Tenant) -> tuple[list[str] | None, str]:
    """The list in force for `tenant` (the nearest one set; None: every registry) and where
    it comes from: "own", "inherited" or "default" (no list up the tree)."""
    lists = chain_lists(tenant)
    if not lists:
        return None, "default"
    holder, entries = lists[-1]
    return entries, "own" if holder.pk == tenant.pk else "inherited"


def image_refusal(*, tenant: Tenant, image: str) -> str | None:
    """Why `tenant` may not run `image` (a list up the tree does not allow it), naming the
    image and the registries that are allowed; None when it may."""
    name = image_name(image)
    for holder, entries in chain_lists(tenant):
        if not any(allows(entry, name) for entry in entries):
            where = f" (set on {holder.slug})" if holder.pk != tenant.pk else ""
            return (
                f"{image[:120]!r} ({name.repository}) is not from a registry that "
                f"{tenant.slug} may use: allowed are {', '.join(entries)}{where}."
            )
    return None


def _entries_checked(tenant: Tenant, entries: list[str]) -> list[str]:
    if len(entries) > MAX_ENTRIES:
        raise ValidationError({"allowed_registries": [f"at most {MAX_ENTRIES} entries."]})
    normalised: list[str] = []
    for entry in entries:
        try:
            value = entry_normalise(entry)
        except ValueError as error:
            raise ValidationError({"allowed_registries": [str(error)]}) from None
        if value not in normalised:
            normalised.append(value)
    parent = tenant.parent
    for holder, above in chain_lists(parent) if parent is not None else []:
        wider = [e for e in normalised if not any(_covers(a, e) for a in above)]
        if wider:
            raise ValidationError(
                {
                    "allowed_registries": [
                        f"{', '.join(wider)} is not within the registries {holder.slug} allows "
                        f"({', '.join(above)}): a tenant may only narrow the list above it."
                    ]
                }
            )
    return normalised


@transaction.atomic
def allowed_registries_set(*, user: Any, tenant: Tenant, entries: list[str]) -> Tenant:
    """Set the tenant's own list (empty: follow the list above). Audited."""
    if not access.can_set_quota(user, tenant):
        raise PermissionDenied(
            f"The registries of '{tenant.slug}' are set by admins of its parent "
            "or by platform admins."
        )
    # Locked so that two admins changing the list at once write one after the other.
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    normalised = _entries_checked(tenant, entries)
    before = list(tenant.allowed_registries)
    if before == normalised:
        return tenant
    tenant.allowed_registries = normalised
    tenant.save(update_fields=["allowed_registries", "updated_at"])
    audit_record(
        actor=user,
        action="tenant.allowed_registries.set",
        tenant=tenant,
        target=tenant,
        before={"allowed_registries": before},
        after={"allowed_registries": normalised},
    )
    return tenant


def registries_view(tenant: Tenant) -> dict[str, Any]:
    """The tenant's own list and the one in force, for the API and the portal."""
    effective, origin = effective_registries(tenant)
    return {
        "tenant": tenant.pk,
        "own": list(tenant.allowed_registries),
        "effective": effective,
        "origin": origin,
    }
