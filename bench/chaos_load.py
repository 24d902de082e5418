"""The chaos benchmark's tenants and jobs: the organisation it seeds, the node list of its
simulated cluster, and the jobs it submits through the API.

Teams' guarantees add up to the cluster and their limits are twice that, so teams borrow
each other's idle guarantee and are reclaimed from; `high` jobs preempt lower ones.
"""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAVOR, MODEL, DEVICE_MIB = "G3", "G3", 32768  # openb's model name and its flavor
TEAMS = ("team-a", "team-b", "team-c", "team-d")


def write_nodes_csv(path: Path, nodes: int, gpus: int) -> list[str]:
    """An openb node list (`run_scheduler --nodes-csv`): `nodes` nodes of `gpus` devices."""
    names = [f"chaos-{i:03d}" for i in range(nodes)]
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    rows += [f"{name},256000,1048576,{gpus},{MODEL}" for name in names]
    path.write_text("\n".join(rows) + "\n")
    return names


def seed(*, total_milli: int) -> dict[str, tuple[str, int]]:
    """The organisation: one root holding the cluster, four teams each guaranteed a quarter
    and allowed half, each with one member (an email, for notifications), a project and an
    API token. Returns team slug -> (token, project id)."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from tenants.models import Membership, Project, Quota, ResourceFlavor, Role, Tenant

    flavor, _ = ResourceFlavor.objects.get_or_create(
        name=FLAVOR, defaults={"memory_mib": DEVICE_MIB}
    )
    root = Tenant.objects.create(slug="chaos-org", name="chaos org", kind="organisation")
    root.path, root.depth = f"/{root.pk}/", 0
    root.save(update_fields=["path", "depth"])
    Quota.objects.create(
        tenant=root, flavor=flavor, guaranteed_milli=total_milli, limit_milli=total_milli
    )
    out = {}
    for slug in TEAMS:
        team = Tenant.objects.create(slug=slug, name=slug, parent=root)
        team.path, team.depth = f"{root.path}{team.pk}/", 1
        team.save(update_fields=["path", "depth"])
        guaranteed = total_milli // len(TEAMS)
        Quota.objects.create(
            tenant=team, flavor=flavor, guaranteed_milli=guaranteed, limit_milli=2 * guaranteed
        )
        user = get_user_model().objects.create(username=f"chaos-{slug}", email=f"{slug}@chaos.test")
        Membership.objects.create(user=user, tenant=team, role=Role.MEMBER)
        project = Project.objects.create(tenant=team, slug=slug, name=slug, namespace=slug)
        out[slug] = (Token.objects.create(user=user).key, project.pk)
    return out


def job_spec(index: int, rng: random.Random, runtime_s: tuple[int, int]) -> dict[str, Any]:
    """The `index`-th job: a mix of whole, multi-GPU, fractional, gang and high-priority jobs
    (`kind` names which), each running a few seconds on the simulated cluster."""
    duration = rng.randint(*runtime_s)
    roll = rng.random()
    resources: dict[str, Any]
    kind, job_type, replicas, priority = "whole", "batch", 1, rng.choice(["low", "normal"])
    if roll < 0.35:
        resources = {"gpus": 1}
    elif roll < 0.55:
        kind, share = "fractional", rng.choice([250, 500])
        resources = {"gpu_milli": share, "gpu_memory_mib": DEVICE_MIB * share // 1000}
    elif roll < 0.70:
        kind, job_type, resources = "multi", "training", {"gpus": rng.choice([2, 4])}
    elif roll < 0.90:
        kind, job_type, replicas = "gang", "training", rng.choice([2, 3])
        resources = {"gpus": rng.choice([1, 2])}
    else:
        kind, job_type, priority = "high", "training", "high"
        resources = {"gpus": rng.choice([2, 4, 8])}
    return {
        "name": f"chaos-{kind}-{index}",
        "type": job_type,
        "image": "chaos/job:1",
        "command": ["run"],
        "replicas": replicas,
        "resources": resources,
        "priority_class": priority,
        "simulation": {"duration_s": duration},
    }


@dataclass
class Api:
    """A client of the web server: JSON over HTTP with a token; every outcome counted."""

    base: str
    timeout_s: float = 30.0
    counts: dict[str, int] = field(default_factory=dict)

    def call(
        self, method: str, path: str, token: str, body: Any = None, key: str | None = None
    ) -> tuple[int, Any]:
        """(status, decoded body); status 0 when the server could not be reached."""
        headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if key is not None:
            headers["Idempotency-Key"] = key
        # The run's own web server on loopback (`base` is http://127.0.0.1:port).
        request = urllib.request.Request(self.base + path, data, headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        except (TimeoutError, urllib.error.URLError, OSError):
            status, raw = 0, b""
        self.counts[str(status)] = self.counts.get(str(status), 0) + 1
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw[:500].decode(errors="replace")
