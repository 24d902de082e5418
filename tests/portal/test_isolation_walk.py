"""Walk every portal route, found from `portal.urls`, as every persona, aimed at another team.

A route added without an entry in ROUTES fails `test_every_portal_route_is_covered`, so a new
page or partial cannot escape these checks. For each persona the "foreign" team is one they
hold no role in: every id of it is a 404 on every route and method (405 where the method is
not served at all), every filter naming it is a 404, no page shows its marker, and nothing
of it changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, reverse
from django.utils import timezone

from billing.models import CostExport
from capacity.models import RateSuggestion
from portal import urls as portal_urls
from scheduler.models import Cluster, Job, Node
from tenants.models import (
    ApprovalPolicy,
    ApprovalRequest,
    AuditEntry,
    IdleRule,
    Membership,
    Notification,
    PriorityDefault,
    Quota,
    ResourceFlavor,
    Tenant,
)
from tests.class_data import built_for_the_class, copied
from tests.conftest import Org, build_org
from tests.factories import AllocationFactory
from tests.isolation_personas import AGENT, add_personas, token_key
from tests.portal.conftest import TeamObjects, World, build_world
from tests.whatif.builders import kept_run
from whatif.models import WhatIf


@pytest.fixture(scope="module")
def built_world(django_db_setup: None, django_db_blocker: Any) -> Iterator[World]:
    """The world, built once for the module (tests/class_data.py): every database test of
    the module walks it, each rolling back its own writes."""
    yield from built_for_the_class(django_db_blocker, lambda: build_world(build_org()))


@pytest.fixture
def world(built_world: World, db: None) -> World:
    return copied(built_world)


@pytest.fixture
def org(world: World) -> Org:
    """The world's organisation: the personas a test adds to it are `web_for`'s too."""
    return world.org


@dataclass(frozen=True)
class Case:
    """One way to aim a route at the foreign team.

    `kwargs(foreign, own)` fills the URL; `query` is a filter naming the foreign team (the
    route is then a list that must refuse it); `body` is what a POST sends.
    """

    kwargs: Callable[[TeamObjects, TeamObjects], dict[str, Any]] | None = None
    query: Callable[[TeamObjects], dict[str, Any]] | None = None
    body: Callable[[World, TeamObjects], dict[str, Any]] | None = None


def _tenant(foreign: TeamObjects, own: TeamObjects) -> dict[str, Any]:
    return {"pk": foreign.tenant.pk}


def _job(foreign: TeamObjects, own: TeamObjects) -> dict[str, Any]:
    return {"pk": foreign.queued.pk}


def _export(foreign: TeamObjects, own: TeamObjects) -> dict[str, Any]:
    """An export of the foreign team's member (exports are their owner's alone)."""
    owner = foreign.membership.user
    now = timezone.now()
    export = CostExport.objects.filter(owner=owner).first() or CostExport.objects.create(
        owner=owner,
        query={"from": "2031-01-01T00:00:00Z", "to": "2031-02-01T00:00:00Z", "by": "team"},
        format="csv",
        filename=f"costs-{foreign.tenant.slug}.csv",
        created_at=now,
        expires_at=now + timedelta(days=1),
    )
    return {"pk": export.pk}


def _node(foreign: TeamObjects, own: TeamObjects) -> dict[str, Any]:
    """A node running the foreign team's queued job (the Nodes pages are platform admins'
    alone: every other persona gets a 404, and sees neither the node nor what runs there)."""
    node, _ = Node.objects.get_or_create(name=f"node-{foreign.tenant.slug}")
    if not node.allocations.exists():
        AllocationFactory(job=foreign.queued, node=node)
    return {"pk": node.pk}


def _cluster(foreign: TeamObjects, own: TeamObjects) -> dict[str, Any]:
    """A cluster (platform admins' page: a 404 for everyone else, and never cordoned by them)."""
    cluster, _ = Cluster.objects.get_or_create(name="site-walk", defaults={"backend": "simulated"})
    return {"pk": cluster.pk}


def _whatif(foreign: TeamObjects, own: TeamObjects) -> dict[str, Any]:
    """A kept what-if scoped to the foreign team (platform and tenant admins' feature)."""
    run = WhatIf.objects.filter(scope=foreign.tenant).first()
    if run is None:
        run = kept_run(User.objects.get(username="pat"), foreign.tenant, [foreign.tenant.slug])
    return {"pk": run.pk}


def _suggestion(foreign: TeamObjects, own: TeamObjects) -> dict[str, Any]:
    """A pending rate suggestion (finance's and platform admins' alone: a 404 for others)."""
    suggestion = RateSuggestion.objects.first() or RateSuggestion.objects.create(
        flavor=ResourceFlavor.objects.get(name="H100-80GB"),
        gpu_hour=Decimal("1.5"),
        target_utilization=Decimal("0.8"),
        explain="walk",
        created_at=timezone.now(),
    )
    return {"pk": suggestion.pk}


WHATIF_BODY = {"window_days": "1", "flavor": "H100-80GB", "weight": "2"}
QUOTA_BODY = {"flavor": "A100-40GB", "guaranteed": "1", "limit": "1", "weight": "1"}
EXPORT_BODY = {"format": "csv", "from": "2031-01-01", "to": "2031-02-01", "by": "team"}
POLICY_BODY = {"rule": "gpus_over", "threshold": "1", "applies_to_jobs": "on"}
IDLE_BODY = {"threshold_pct": "1", "duration_minutes": "5", "action": "notify_and_stop"}

# route name -> the cases that aim it at the foreign team. Lists without ids are walked for
# leaks; their filters naming a foreign object must be a 404.
ROUTES: dict[str, list[Case]] = {
    "login": [],
    "logout": [],
    "home": [],
    "tenants": [],
    "approvals": [],
    "approval-history": [],
    "scheduler-profile": [],
    "dashboard-cluster": [],  # platform admins and finance; a 404 for the personas walked
    "tenant-dashboard": [Case(kwargs=_tenant)],
    "nodes": [],
    "node-detail": [Case(kwargs=_node)],
    "node-action": [
        Case(kwargs=_node, body=lambda w, t: {"action": "drain", "confirm": "on"}),
        Case(kwargs=_node, body=lambda w, t: {"action": "heal"}),
        Case(kwargs=_node, body=lambda w, t: {"action": "fail"}),
    ],
    "clusters": [],
    "cluster-action": [Case(kwargs=_cluster, body=lambda w, t: {"action": "cordon"})],
    "jobs": [Case(query=lambda t: {"project": t.queued.project_id})],
    "job-rows": [Case(query=lambda t: {"project": t.queued.project_id})],
    "job-new": [
        Case(
            body=lambda w, t: {
                "project": t.queued.project_id,
                "job_type": "training",
                "name": "intruder",
                "image": "pytorch/pytorch:2.4",
                "command": "python x.py",
                "replicas": 1,
                "gpus": 1,
                "cpu_milli": 1000,
                "memory_mib": 1024,
                "retry_limit": 0,
                "idempotency_key": "k1",
            }
        )
    ],
    "audit": [Case(query=lambda t: {"tenant": t.tenant.pk})],
    "audit-export": [Case(query=lambda t: {"tenant": t.tenant.pk})],
    "costs": [Case(query=lambda t: {"tenant": t.tenant.pk})],
    "cost-export-new": [Case(body=lambda w, t: {**EXPORT_BODY, "tenant": t.tenant.pk})],
    "cost-export-status": [Case(kwargs=_export)],
    "cost-export-download": [Case(kwargs=_export)],
    # Prices are platform-wide, no tenant's data (read by everyone; added by finance and
    # platform admins: tests/portal/test_rate_cards_page.py walks who may).
    "rate-cards": [],
    "job-detail": [Case(kwargs=_job)],
    "job-status": [Case(kwargs=_job)],
    "job-logs": [Case(kwargs=_job)],
    "job-cancel": [
        Case(kwargs=_job, body=lambda w, t: {"reason": "intrusion"}),
        Case(kwargs=lambda t, o: {"pk": t.pending.pk}, body=lambda w, t: {}),
    ],
    "tenant-detail": [Case(kwargs=_tenant)],
    "tenant-members": [
        Case(kwargs=_tenant, body=lambda w, t: {"username": "alice", "role": "admin"})
    ],
    "tenant-member-role": [
        Case(
            kwargs=lambda t, o: {"pk": t.tenant.pk, "membership_pk": t.membership.pk},
            body=lambda w, t: {"role": "admin"},
        ),
        # the user's own tenant with the foreign team's membership id
        Case(
            kwargs=lambda t, o: {"pk": o.tenant.pk, "membership_pk": t.membership.pk},
            body=lambda w, t: {"role": "admin"},
        ),
    ],
    "tenant-member-remove": [
        Case(
            kwargs=lambda t, o: {"pk": t.tenant.pk, "membership_pk": t.membership.pk},
            body=lambda w, t: {},
        ),
        Case(
            kwargs=lambda t, o: {"pk": o.tenant.pk, "membership_pk": t.membership.pk},
            body=lambda w, t: {},
        ),
    ],
    "tenant-quotas": [Case(kwargs=_tenant, body=lambda w, t: QUOTA_BODY)],
    "tenant-priorities": [
        Case(
            kwargs=_tenant, body=lambda w, t: {"job_type": "training", "priority_class": "critical"}
        )
    ],
    "tenant-policies": [Case(kwargs=_tenant, body=lambda w, t: POLICY_BODY)],
    "tenant-notifications": [Case(kwargs=_tenant, body=lambda w, t: IDLE_BODY)],
    "tenant-idle-rule-delete": [Case(kwargs=_tenant, body=lambda w, t: {})],
    "tenant-registries": [Case(kwargs=_tenant, body=lambda w, t: {"entries": "evil.example.com"})],
    "tenant-webhook": [
        Case(kwargs=_tenant, body=lambda w, t: {"webhook_url": "https://intruder.example.com/h"})
    ],
    "tenant-webhook-test": [Case(kwargs=_tenant, body=lambda w, t: {})],
    "tenant-webhook-secret": [Case(kwargs=_tenant, body=lambda w, t: {})],
    "tenant-policy-delete": [
        Case(
            kwargs=lambda t, o: {"pk": t.tenant.pk, "policy_pk": t.policy.pk}, body=lambda w, t: {}
        ),
        Case(
            kwargs=lambda t, o: {"pk": o.tenant.pk, "policy_pk": t.policy.pk}, body=lambda w, t: {}
        ),
    ],
    "approval-decide": [
        Case(
            kwargs=lambda t, o: {"pk": t.request.pk},
            body=lambda w, t: {"decision": "approve", "comment": "ok"},
        )
    ],
    "approval-whatif": [Case(kwargs=lambda t, o: {"pk": t.request.pk}, body=lambda w, t: {})],
    "whatifs": [],
    "whatif-new": [
        Case(body=lambda w, t: {**WHATIF_BODY, "scope": t.tenant.pk, "tenant": t.tenant.slug})
    ],
    "whatif-detail": [Case(kwargs=_whatif)],
    "whatif-status": [Case(kwargs=_whatif)],
    # Capacity: pools for finance and platform admins, subtrees for tenant admins, 403 for
    # others (tests/capacity/test_portal.py walks who sees what); TCO inputs are finance's.
    "capacity": [],
    "capacity-export": [],
    "capacity-tco": [Case(body=lambda w, t: {"flavor": "not-a-model"})],
    "capacity-expansion": [Case(body=lambda w, t: {"flavor": "H100-80GB", "action": "add"})],
    "capacity-target": [Case(body=lambda w, t: {"flavor": "H100-80GB", "target_utilization": "2"})],
    "capacity-suggest": [Case(body=lambda w, t: {"flavor": "not-a-model"})],
    "capacity-suggestion-decide": [
        Case(kwargs=_suggestion, body=lambda w, t: {"decision": "reject", "reason": ""})
    ],
}
# Routes without tenant data: only the leak check applies.
NO_TENANT_DATA = {"login", "logout"}
# Writes that change nothing of anyone else's: an export of what the user sees, for themselves;
# capacity planning's TCO inputs and rate suggestions, finance's own. The walk's bodies are
# refused and nothing is saved: a redirect with the reason, or the capacity page's form again
# with its error (400). Route -> the status it answers.
OWN_WRITES = {
    "cost-export-new": 302,
    "capacity-tco": 400,
    "capacity-suggest": 400,
    "capacity-suggestion-decide": 302,
}
# Pages of platform admins alone: 404 for everyone else, finance included.
PLATFORM_ADMIN_ONLY = {"nodes", "node-detail", "node-action", "clusters", "cluster-action"}
# What only the team's own members and platform admins read (logs may hold secrets and are
# not cost data): a 404 for finance, who sees the job and its cost.
TEAM_MEMBERS_ONLY = {"job-logs"}

# persona -> (the team whose objects they must never see, a team they do see; None: no team's
# jobs). tests/isolation_personas.py adds april, gus and nobody.
PERSONAS: dict[str, tuple[str, str | None]] = {
    "alice": ("bravo", "alpha"),  # member of team-alpha
    "april": ("bravo", "alpha"),  # approver of team-alpha
    "bob-bravo": ("alpha", "bravo"),  # member of team-bravo
    "tina": ("bravo", "alpha"),  # admin of team-alpha
    "dana": ("charlie", "alpha"),  # admin of research (alpha and bravo)
    "chris": ("alpha", "charlie"),  # member of team-charlie
    "gus": ("alpha", None),  # member of a group below team-charlie (its own project only)
    "nobody": ("alpha", None),  # no role anywhere: every team is foreign
}
# The markers a persona must never see: nobody sees none of the teams.
NEVER_SEEN = {"nobody": ("alpha", "bravo", "charlie")}


HTMX = {"HX-Request": "true"}


def portal_route_names() -> list[str]:
    return [p.name for p in portal_urls.urlpatterns if isinstance(p, URLPattern) and p.name]


def test_every_portal_route_is_covered() -> None:
    names = portal_route_names()
    assert len(names) >= 20, names
    missing = [name for name in names if name not in ROUTES]
    assert not missing, f"portal routes without an isolation entry: {missing}"
    stale = [name for name in ROUTES if name not in names]
    assert not stale, f"isolation entries for routes that no longer exist: {stale}"
    with_ids = [p.name for p in portal_urls.urlpatterns if p.pattern.converters]
    assert all(any(c.kwargs for c in ROUTES[name]) for name in with_ids), with_ids


def state_of_everything() -> dict[str, Any]:
    """Every row a forged request could touch, to compare before and after the walk."""
    return {
        "jobs": sorted(Job.objects.values_list("pk", "state", "name")),
        "memberships": sorted(Membership.objects.values_list("pk", "tenant_id", "role")),
        "quotas": sorted(Quota.objects.values_list("pk", "guaranteed_milli", "limit_milli")),
        "defaults": sorted(PriorityDefault.objects.values_list("pk", "priority_class_id")),
        "policies": sorted(ApprovalPolicy.objects.values_list("pk", "rule", "threshold")),
        "requests": sorted(ApprovalRequest.objects.values_list("pk", "state")),
        "audit": AuditEntry.objects.count(),
        "idle_rules": sorted(IdleRule.objects.values_list("pk", "threshold_pct", "action")),
        "webhooks": sorted(Tenant.objects.values_list("pk", "webhook_url")),
        "registries": sorted(Tenant.objects.values_list("pk", "allowed_registries")),
        "notifications": Notification.objects.count(),
        # the nodes some action changed (the walk makes its nodes as it goes)
        "nodes": sorted(
            Node.objects.exclude(
                cordoned=False, drain_requested=False, sim_failed=False
            ).values_list("pk", "cordoned", "drain_requested", "sim_failed")
        ),
    }


# CSRF tokens are random letters and digits: one may spell the marker ("...bravo...") by
# chance, which once failed this walk. They are blanked before the page is searched.
_CSRF = re.compile(r'("X-CSRFToken": "|name="csrfmiddlewaretoken" value=")[A-Za-z0-9]+')


def _content(response: Any) -> str:
    if getattr(response, "streaming", False):
        text = b"".join(response.streaming_content).decode()
    else:
        text = response.content.decode()
    return _CSRF.sub(r"\1", text)


@pytest.mark.parametrize("persona", sorted(PERSONAS))
def test_portal_isolation_walk(persona: str, world: World, web_for: Any) -> None:
    add_personas(world.org)
    foreign_key, own_key = PERSONAS[persona]
    foreign, own = world.teams[foreign_key], world.teams[own_key or "charlie"]
    # every name of the foreign team contains its marker
    markers = NEVER_SEEN.get(persona, (foreign_key,))
    client = web_for(persona)
    before = state_of_everything()
    checked = 0
    for name, cases in ROUTES.items():
        if not cases:
            # a page without ids: it renders (or refuses) without the foreign team's data
            if name == "logout":
                continue
            response = client.get(reverse(f"portal:{name}"))
            assert response.status_code in (200, 302, 403, 404), (name, response.status_code)
            assert not shown(markers, response), f"{name} shows {markers}"
            checked += 1
            continue
        for case in cases:
            url = reverse(
                f"portal:{name}", kwargs=case.kwargs(foreign, own) if case.kwargs else None
            )
            query = case.query(foreign) if case.query else {}
            # as a page and as an HTMX partial request
            for method, headers in [(m, h) for m in ("get", "post") for h in ({}, HTMX)]:
                if method == "post" and case.body is None and not case.kwargs:
                    continue
                body = case.body(world, foreign) if case.body and method == "post" else {}
                if method == "get":
                    response = client.get(url, query, headers=headers)
                else:
                    response = client.post(url + _qs(query), body, headers=headers)
                if case.kwargs or query or method == "post":
                    expected = (404, 405) if case.kwargs else (404,)
                    if name == "job-new" and method == "get":
                        continue
                    assert response.status_code in expected, (name, method, response.status_code)
                assert not shown(markers, response), f"{name} {method} shows {markers}"
                checked += 1
    assert checked >= 40
    assert state_of_everything() == before, "a forged request changed something"


def shown(markers: tuple[str, ...], response: Any) -> list[str]:
    text = _content(response).lower()
    return [marker for marker in markers if marker in text]


def _qs(query: dict[str, Any]) -> str:
    return "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""


@pytest.mark.parametrize("persona", sorted(p for p in PERSONAS if PERSONAS[p][1]))
def test_lists_show_own_team_but_never_the_foreign_one(
    persona: str, world: World, web_for: Any
) -> None:
    """The same pages do show the persona's own team: the walk above is not vacuous."""
    add_personas(world.org)
    foreign_key, own_key = PERSONAS[persona]
    assert own_key is not None
    client = web_for(persona)
    jobs = client.get(reverse("portal:jobs")).content.decode()
    assert f"small-team-{own_key}" in jobs
    assert foreign_key not in jobs
    rows = client.get(reverse("portal:job-rows"), HTTP_HX_REQUEST="true").content.decode()
    assert f"small-team-{own_key}" in rows and "<html" not in rows
    detail = client.get(reverse("portal:job-detail", kwargs={"pk": world.teams[own_key].queued.pk}))
    assert detail.status_code == 200


def test_finance_and_platform_admin_see_every_team(world: World, web_for: Any) -> None:
    for persona in ("carol", "pat"):
        jobs = web_for(persona).get(reverse("portal:jobs")).content.decode()
        assert all(f"small-team-{team}" in jobs for team in ("alpha", "bravo", "charlie"))


def test_finance_reads_no_team_logs_but_platform_admins_do(world: World, web_for: Any) -> None:
    for name in TEAM_MEMBERS_ONLY:
        for case in ROUTES[name]:
            assert case.kwargs is not None
            team = world.teams["alpha"]
            url = reverse(f"portal:{name}", kwargs=case.kwargs(team, team))
            assert web_for("carol").get(url, headers=HTMX).status_code == 404, name
            assert web_for("pat").get(url, headers=HTMX).status_code == 200, name
            assert web_for("alice").get(url, headers=HTMX).status_code == 200, name


def test_job_new_post_to_a_foreign_project_creates_nothing(world: World, web_for: Any) -> None:
    body = {
        "project": world.teams["bravo"].queued.project_id,
        "job_type": "training",
        "name": "intruder",
        "image": "pytorch/pytorch:2.4",
        "command": "python x.py",
        "replicas": 1,
        "gpus": 1,
        "cpu_milli": 1000,
        "memory_mib": 1024,
        "retry_limit": 0,
        "idempotency_key": "intruder-1",
    }
    response = web_for("alice").post(reverse("portal:job-new"), body)
    assert response.status_code == 404
    assert not Job.objects.filter(name="intruder").exists()


def test_finance_sees_everything_but_changes_nothing(world: World, web_for: Any) -> None:
    """Every write route, aimed at a team finance can see, is a 403 and changes nothing."""
    team = world.teams["alpha"]
    client = web_for("carol")
    before = state_of_everything()
    posted = 0
    for name, cases in ROUTES.items():
        for case in cases:
            if case.body is None:
                continue
            url = reverse(f"portal:{name}", kwargs=case.kwargs(team, team) if case.kwargs else None)
            response = client.post(url, case.body(world, team))
            expected = OWN_WRITES.get(name, 404 if name in PLATFORM_ADMIN_ONLY else 403)
            assert response.status_code == expected, (name, response.status_code)
            posted += 1
    assert posted >= 12
    assert state_of_everything() == before


def every_portal_request(world: World) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(route name, method, url, body) of every route and case, aimed at team-alpha."""
    team = world.teams["alpha"]
    requests = []
    for name, cases in ROUTES.items():
        for case in cases or [Case()]:
            kwargs = case.kwargs(team, team) if case.kwargs else None
            url = reverse(f"portal:{name}", kwargs=kwargs) + _qs(
                case.query(team) if case.query else {}
            )
            body = case.body(world, team) if case.body else {}
            requests += [(name, "get", url, {}), (name, "post", url, body)]
    return requests


LOGIN = reverse("portal:login")


def to_login(response: Any, headers: dict[str, str]) -> bool:
    """A redirect to the login page: HTMX is told to load it (HX-Redirect, an empty 200,
    since HTMX does not follow a 302 with the whole page), a page gets a 302."""
    if headers:
        target = response.headers.get("HX-Redirect", "")
        return response.status_code == 200 and target.startswith(LOGIN) and not response.content
    return response.status_code == 302 and response["Location"].startswith(LOGIN)


@pytest.mark.parametrize("headers", [{}, HTMX], ids=["page", "htmx"])
def test_anonymous_visitors_are_sent_to_login(world: World, headers: dict[str, str]) -> None:
    """Every route, page and HTMX partial, GET and POST, without a session: a redirect to the
    login page, never data, and nothing changes."""
    client = Client()
    before = state_of_everything()
    walked = 0
    for name, method, url, body in every_portal_request(world):
        if name in NO_TENANT_DATA:
            continue
        response = getattr(client, method)(url, body, headers=headers)
        assert not shown(("alpha", "bravo", "charlie"), response), (name, method)
        if response.status_code == 405:
            continue  # a method the route does not serve at all, refused before the login
        assert to_login(response, headers), (name, method, response.status_code)
        walked += 1
    assert walked >= 80, walked
    assert state_of_everything() == before


@pytest.mark.parametrize("persona", ["alice", AGENT])
def test_an_api_token_opens_no_portal_page(world: World, persona: str) -> None:
    """A member's API token, or a node agent's, sent to the portal authenticates nobody: every
    route answers as to an anonymous visitor. The agent's token is no password either."""
    add_personas(world.org)
    user = world.org.users[persona]
    key = token_key(user)
    client = Client(headers={"Authorization": f"Token {key}"})
    for name, method, url, _ in every_portal_request(world):
        if name in NO_TENANT_DATA or method != "get":
            continue
        response = client.get(url)
        assert to_login(response, {}), (name, response.status_code)
    login = Client()
    response = login.post(LOGIN, {"username": user.username, "password": key})
    assert response.status_code == 200  # the form again, with its error
    assert "_auth_user_id" not in login.session


def test_what_the_added_personas_may_do_in_the_portal(world: World, web_for: Any) -> None:
    """The other side of the walk for april, gus and nobody: their pages show what their role
    gives them, so that their walks are not vacuous."""
    add_personas(world.org)
    alpha, bravo = world.teams["alpha"], world.teams["bravo"]
    april = web_for("april")
    inbox = april.get(reverse("portal:approvals")).content.decode()
    assert "big-team-alpha" in inbox and "bravo" not in inbox
    decided = april.post(
        reverse("portal:approval-decide", args=[alpha.request.pk]), {"decision": "approve"}
    )
    assert decided.status_code == 302
    alpha.request.refresh_from_db()
    assert alpha.request.state == "approved"
    bravo_decide = reverse("portal:approval-decide", args=[bravo.request.pk])
    assert april.post(bravo_decide, {"decision": "approve"}).status_code == 404
    gus = web_for("gus").get(reverse("portal:job-new")).content.decode()
    assert "team-charlie-ml / proj-charlie-ml" in gus  # the group's project, the only choice
    assert "team-charlie / proj-charlie" not in gus
    nobody = web_for("nobody")
    assert nobody.get(reverse("portal:job-new")).status_code == 403
    jobs = nobody.get(reverse("portal:jobs")).content.decode()
    assert not [team for team in ("alpha", "bravo", "charlie") if team in jobs]
