"""The chaos benchmark's tenants and jobs: the organisation it seeds, the node list of its
simulated cluster, and the jobs it submits through the API.

Teams' guarantees add up to the cluster and their limits are twice that, so teams borrow
each other's idle guarantee and are reclaimed from; `high` jobs preempt lower ones.
"""

from __future__ import annotations

import http.cookiejar
import json
import random
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAVOR, MODEL, DEVICE_MIB = "G3", "G3", 32768  # openb's model name and its flavor
TEAMS = ("team-a", "team-b", "team-c", "team-d")
PASSWORD = "chaos-bench-password"  # the run's throwaway users


def write_nodes_csv(path: Path, nodes: int, gpus: int) -> list[str]:
    """An openb node list (`run_scheduler --nodes-csv`): `nodes` nodes of `gpus` devices."""
    names = [f"chaos-{i:03d}" for i in range(nodes)]
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    rows += [f"{name},256000,1048576,{gpus},{MODEL}" for name in names]
    path.write_text("\n".join(rows) + "\n")
    return names


def seed(*, total_milli: int) -> dict[str, tuple[str, int]]:
    """The organisation: one root holding the cluster, four teams each guaranteed a quarter
    and allowed a quarter more (a limit the teams' borrowing reaches, so that the run tests
    it), each with one member (an email, for notifications), a project and an
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
            tenant=team, flavor=flavor, guaranteed_milli=guaranteed, limit_milli=guaranteed * 5 // 4
        )
        user = get_user_model().objects.create(username=f"chaos-{slug}", email=f"{slug}@chaos.test")
        user.set_password(PASSWORD)
        user.save(update_fields=["password"])
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


@dataclass
class Portal:
    """A person in the web portal: a session (cookies, CSRF token), pages read and the job
    form posted as a browser does. Each call returns the status (0: no answer) and, for the
    form, the id of the job it created."""

    base: str
    timeout_s: float = 30.0
    jar: http.cookiejar.CookieJar = field(default_factory=http.cookiejar.CookieJar)

    def _open(self, path: str, form: dict[str, Any] | None = None) -> tuple[int, str]:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        data = None if form is None else urllib.parse.urlencode(form, doseq=True).encode()
        headers = {"Referer": self.base + path}
        request = urllib.request.Request(self.base + path, data, headers)  # noqa: S310 - loopback
        try:
            with opener.open(request, timeout=self.timeout_s) as response:
                return response.status, response.geturl()
        except urllib.error.HTTPError as error:
            return error.code, ""
        except (TimeoutError, urllib.error.URLError, OSError):
            return 0, ""

    def _csrf(self) -> str:
        return next((c.value for c in self.jar if c.name == "csrftoken"), "") or ""

    def _signed_in(self, answer: tuple[int, str]) -> int:
        """The status, or 0 where the portal answered with its login page (not signed in)."""
        status, url = answer
        return 0 if urllib.parse.urlparse(url).path == "/accounts/login/" else status

    def login(self, username: str) -> int:
        self._open("/accounts/login/")
        form = {"username": username, "password": PASSWORD, "csrfmiddlewaretoken": self._csrf()}
        return self._signed_in(self._open("/accounts/login/", form))

    def get(self, path: str) -> int:
        return self._signed_in(self._open(path))

    def submit(self, project: int, name: str, key: str) -> tuple[int, int | None]:
        """The job form of /jobs/new/ (a one-GPU batch job); on success the portal redirects
        to the job's page, whose id is returned."""
        self._open("/jobs/new/")
        form = {
            "csrfmiddlewaretoken": self._csrf(), "project": project, "job_type": "batch",
            "name": name, "image": "chaos/job:1", "command": "run", "replicas": 1, "gpus": 1,
            "cpu_milli": 1000, "memory_mib": 4096, "retry_limit": 0, "idempotency_key": key,
            "priority_class": "low",
        }  # fmt: skip
        status, url = self._open("/jobs/new/", form)
        found = re.search(r"/jobs/(\d+)/\Z", urllib.parse.urlparse(url).path)
        return status, int(found.group(1)) if found else None
