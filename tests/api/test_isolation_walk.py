"""Walk every API route, found from the URL configuration, as every persona.

A route added without an entry in FOREIGN_OBJECTS fails `test_every_route_is_covered`, so a new
endpoint cannot escape the isolation checks. For each persona, the "foreign" tenant is one
they hold no role in: every object of it is 404 on every detail route and method, absent from
every list, and never changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from billing.metering.hourly import meter_usage
from billing.models import Budget, CostExport, Statement
from billing.rates.cards import RatePrices, rate_card_add
from billing.statements.closing import statement_close
from capacity.models import PoolTarget, RateSuggestion, TcoInputs
from common.api.routers import ID_PATTERN
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobState
from tenants import approval_policies
from tenants.models import (
    ApprovalPolicy,
    ApprovalRequest,
    AuditEntry,
    Membership,
    PriorityDefault,
    Quota,
    Tenant,
)
from tests import factories as f
from tests.billing.builders import T0, at, hold, make_node
from tests.capacity.builders import stored_run
from tests.conftest import Org, job_spec
from tests.isolation_personas import AGENT, AGENT_NODE, add_personas, token_client
from tests.whatif.builders import kept_run
from whatif.models import WhatIf


@dataclass(frozen=True)
class Route:
    template: str  # e.g. "api/v1/jobs/<pk>/cancel/"
    name: str
    methods: tuple[str, ...]

    @property
    def is_detail(self) -> bool:
        return "<pk>" in self.template


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry.callback, entry.name or ""


def _methods(callback: Any) -> tuple[str, ...]:
    actions = getattr(callback, "actions", None)
    if actions:
        return tuple(sorted(m.upper() for m in actions))
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is None:
        return ("GET",)
    return tuple(
        sorted(
            m.upper()
            for m in view_class.http_method_names
            if hasattr(view_class, m) and m not in {"options", "head"}
        )
    )


def api_routes() -> list[Route]:
    routes = []
    for template, callback, name in _walk(get_resolver().url_patterns):
        if not template.startswith("api/v1/"):
            continue
        clean = (
            template.replace(f"(?P<pk>{ID_PATTERN})", "<pk>")
            .replace("^", "")
            .replace("$", "")
            .replace("\\Z", "")
        )
        clean = clean.replace("\\.(?P<format>[a-z0-9]+)/?", "")
        if "<format>" in clean or "(?P<format>" in template:
            continue
        routes.append(Route(clean, name, _methods(callback)))
    return routes


# basename of a detail route -> the object of a foreign tenant to aim at it.
FOREIGN_OBJECTS: dict[str, Callable[[Org, Tenant], Any]] = {
    "tenant": lambda org, t: t,
    "project": lambda org, t: t.projects.first(),
    "membership": lambda org, t: Membership.objects.filter(tenant=t).first(),
    "quota": lambda org, t: Quota.objects.filter(tenant=t).first(),
    "prioritydefault": lambda org, t: PriorityDefault.objects.filter(tenant=t).first(),
    "job": lambda org, t: Job.objects.filter(tenant=t).first(),
    "jobqueue": lambda org, t: Job.objects.filter(tenant=t).first(),
    "jobpods": lambda org, t: Job.objects.filter(tenant=t).first(),
    "joblogs": lambda org, t: Job.objects.filter(tenant=t).first(),
    # Your waiting jobs and your tenants' quota use: list-only, walked for leaks.
    "queue": lambda org, t: Job.objects.filter(tenant=t).first(),
    "usage": lambda org, t: t,
    "approvalpolicy": lambda org, t: ApprovalPolicy.objects.filter(tenant=t).first(),
    "approvalrequest": lambda org, t: ApprovalRequest.objects.filter(tenant=t).first(),
    "audit": lambda org, t: AuditEntry.objects.filter(tenant=t).first(),
    # List-only routes over the same objects: listed so the walk checks them for leaks.
    "approvalrequest-inbox": lambda org, t: ApprovalRequest.objects.filter(tenant=t).first(),
    "audit-export": lambda org, t: AuditEntry.objects.filter(tenant=t).first(),
    "quotarequest": lambda org, t: ApprovalRequest.objects.filter(tenant=t).first(),
    # Statements are per organisation: the foreign one is another organisation's. The lines
    # of the user's own organisation's statement are walked in test_statement_shows_...
    "statement": lambda org, t: Statement.objects.get(organisation__slug="globex"),
    # Read by finance and platform admins only: anyone else gets a 404 even for their own
    # organisation's (the id is the organisation's).
    "billingpolicy": lambda org, t: org.acme,
    "cost": lambda org, t: t,
    # A list-level write: its foreign body names the foreign tenant (foreign_create_body).
    "statement-close": lambda org, t: Statement.objects.filter(organisation=t).first(),
    # A quote of a job for the foreign tenant's project (foreign_create_body): a 404, as submit.
    "quote": lambda org, t: t.projects.first(),
    # Budgets: finance manages them all (FINANCE_MANAGES); the walk reads them here.
    "budget": lambda org, t: Budget.objects.filter(tenant=t).first(),
    # Exports are their owner's alone: anyone else, finance and platform admins included, gets
    # a 404 (PERSONAL). The foreign one is a foreign team member's (populate_billing).
    "costexport": lambda org, t: CostExport.objects.filter(owner__memberships__tenant=t).first(),
    # The cost API's figures as a file at once: walked for leaks like the cost API.
    "cost-export": lambda org, t: t,
    # What-ifs scoped to the foreign team (populate_whatifs): admins and finance only.
    "whatif": lambda org, t: WhatIf.objects.filter(scope=t).first(),
    # Capacity plans: pools for finance and platform admins, administered subtrees for tenant
    # admins (populate_capacity: a run naming every team), 403 for anyone else.
    "capacity-plans": lambda org, t: t,
    "capacity-export": lambda org, t: t,
    # An expansion what-if: platform admins start it (a 403 for anyone else, finance too).
    "capacity-expansions": lambda org, t: t,
    # Capacity planning's inputs: platform-wide, finance and platform admins only (403 on the
    # lists, 404 on a suggestion for anyone else).
    "pooltarget": lambda org, t: PoolTarget.objects.first(),
    "tcoinputs": lambda org, t: TcoInputs.objects.first(),
    "ratesuggestion": lambda org, t: RateSuggestion.objects.first(),
}
# List-level writes naming a foreign project: not found, like the project itself.
NOT_FOUND_WRITES = {"quote", "costexport-list"}
# Query strings for list routes that need one to show anything (a window with metered usage).
LIST_QUERY = {
    "cost-list": "?from=2031-01-31T20:00:00Z&to=2031-02-01T00:00:00Z&by=user",
    "cost-export": "?from=2031-01-31T20:00:00Z&to=2031-02-01T00:00:00Z&by=user&format=focus",
}
# List routes finance may post to (closing the books, capacity planning's costs): a bad body
# is a 400 there, not a 403.
BOOKS_KEEPER_WRITES = {"statement-close", "tcoinputs-list", "ratesuggestion-list", "ratecard-list"}
# List routes where anyone writes for themselves (an export of what they may see): finance too.
OWN_WRITES = {"costexport-list"}
# Detail routes of objects that belong to one user: a 404 for anyone else, whatever their role.
PERSONAL = {"costexport"}
# Detail routes of what only the tenant's own members and platform admins read (logs may hold
# secrets and are not cost data): finance without a role on the tenant gets a 404.
TENANT_MEMBERS_ONLY = {"joblogs"}
# Budgets are finance's to manage, every tenant's: finance's writes there are checked in
# tests/billing/test_budgets_api.py, not refused here.
FINANCE_MANAGES = {"budget", "budget-list"}
# Detail routes on platform-wide objects, visible to all, writable by platform admins only.
GLOBAL_DETAIL = {"flavor", "priorityclass", "node", "node-report", "ratecard", "cluster"}
# Features of admins (platform and tenant) and finance: a 404 for anyone else, lists included.
ADMIN_FEATURES = {"whatif"}
# Features of admins (platform and tenant) and finance that answer anyone else 403 (capacity
# planning: its pages say who it is for), and those of finance and platform admins alone.
FORBIDDEN_FEATURES = {"capacity-plans", "capacity-export"}
PLANNERS_ONLY = {"pooltarget", "tcoinputs", "ratesuggestion"}
TENANT_ADMINS = {"tina", "dana"}
# Routes without tenant data (schema, docs, token, me) are checked for leaks only.
NO_TENANT_DATA = {"schema", "api-docs", "api-token", "api-token-rotate", "me"}
# Each cluster's utilization history (read as the clusters API; an empty list for others):
# sums over clusters, no tenant's rows (tests/clusters/test_cluster_history.py).
NO_TENANT_DATA |= {"cluster-utilization"}

# persona -> the tenant whose objects they must never see (tests/isolation_personas.py adds
# april, gus and nobody; "+token" walks as that user through the token, not the session)
PERSONAS = {
    "alice": "bravo",  # member of team-alpha
    "alice+token": "bravo",  # alice's API token
    "april": "bravo",  # approver of team-alpha
    "bob-bravo": "alpha",  # member of team-bravo
    "tina": "bravo",  # admin of team-alpha
    "dana": "charlie",  # admin of research (alpha and bravo)
    "chris": "alpha",  # member of team-charlie
    "gus": "alpha",  # member of a group below team-charlie
    "nobody": "alpha",  # no role anywhere: every tenant is foreign
}
MARKERS = {"alpha": "alpha", "bravo": "bravo", "charlie": "charlie"}
# The markers a persona must never see: nobody sees none of the teams.
NEVER_SEEN = {"nobody": ("alpha", "bravo", "charlie")}


def walk_client(org: Org, client_for: Any, persona: str) -> Any:
    """The persona's client: "name+token" sends the user's API token, as the CLI does."""
    if persona.endswith("+token"):
        return token_client(org.users[persona.removesuffix("+token")])
    return client_for(persona)


def basename(route: Route) -> str:
    return (
        route.name.rsplit("-", 1)[0]
        if route.is_detail or route.name.endswith("-list")
        else route.name
    )


def populate(org: Org) -> None:
    """Give every foreign tenant one object of every kind."""
    populate_whatifs(org)
    populate_capacity(org)
    for tenant, project, user in [
        (org.alpha, org.proj_alpha, org.users["alice"]),
        (org.bravo, org.proj_bravo, org.users["bob-bravo"]),
        (org.charlie, org.proj_charlie, org.users["chris"]),
    ]:
        job = f.JobFactory(project=project, submitted_by=user, name=f"job-{tenant.slug}")
        f.JobEventFactory(job=job, message=f"submitted to {project.slug}")
        PriorityDefault.objects.create(
            tenant=tenant, job_type="batch", priority_class=f.priority("low")
        )
        ApprovalPolicy.objects.create(
            tenant=tenant, rule="gpus_over", threshold=8, description=f"big jobs of {tenant.slug}"
        )
        ApprovalRequest.objects.create(
            kind="job",
            tenant=tenant,
            requester=user,
            subject_id=job.pk,
            payload={"title": f"job {job.name}"},
            expires_at=timezone.now() + timedelta(days=1),
            rules=[{"policy": None, "rule": "gpus_over", "reason": f"big ({tenant.slug})"}],
        )
        AuditEntry.objects.create(
            at=timezone.now(),
            actor=user,
            actor_name=user.username,
            action="job.submit",
            tenant=tenant,
            target_type="scheduler.job",
            target_id=str(job.pk),
            before=None,
            after={"name": job.name, "project": project.slug},
        )


def populate_whatifs(org: Org) -> None:
    """A kept what-if scoped to each team, naming only that team (pat asked for them)."""
    for team in (org.alpha, org.bravo, org.charlie):
        kept_run(org.users["pat"], team, [team.slug])


def populate_capacity(org: Org) -> None:
    """A forecast run naming every team, a pool target, TCO inputs and a rate suggestion."""
    stored_run(org, days=14, horizon=14)
    PoolTarget.objects.create(flavor=org.h100, target_utilization=Decimal("0.8"))
    TcoInputs.objects.create(
        flavor=org.h100,
        purchase_price=Decimal(24000),
        depreciation_months=36,
        power_cooling_per_gpu_hour=Decimal("0.2"),
        hosting_support_per_month=Decimal(100),
        on_demand_per_gpu_hour=Decimal("2.5"),
        committed_per_gpu_hour=Decimal("1.8"),
    )
    RateSuggestion.objects.create(
        flavor=org.h100,
        gpu_hour=Decimal("1.531"),
        target_utilization=Decimal("0.8"),
        explain="walk",
        created_at=timezone.now(),
    )


def populate_billing(org: Org) -> Statement:
    """Metered usage of every team's job, acme's closed statement for it, and another
    organisation's statement."""
    rate_card_add(
        user=org.users["pat"],
        flavor=org.h100,
        valid_from=T0 - timedelta(days=30),
        prices=RatePrices(Decimal(2)),
    )
    node = make_node("n-walk", gpus=3)
    for index, job in enumerate(Job.objects.filter(name__startswith="job-").order_by("pk")):
        hold(job, node, 0, 2, [1000], first_device=index)
    meter_usage(now=at(3))
    for username in ["alice", "bob-bravo", "chris"]:
        CostExport.objects.create(
            owner=org.users[username],
            query={"from": "2031-01-31T20:00:00Z", "to": "2031-02-01T00:00:00Z", "by": "user"},
            format="csv",
            filename=f"export-of-{username}.csv",
            created_at=at(3),
            expires_at=at(30),
        )
    for tenant in (org.alpha, org.bravo, org.charlie):
        Budget.objects.create(tenant=tenant, month=T0.replace(day=1, hour=0), limit=Decimal(100))
    globex = f.TenantFactory(slug="globex", kind="organisation")
    Statement.objects.create(
        organisation=globex, period_start=T0, period_end=at(2), currency="USD", closed_at=at(3)
    )
    return statement_close(
        user=org.users["pat"], organisation=org.acme, start=T0, end=at(2), now=at(3)
    )


def text_of(response: Any) -> str:
    """The body of a response, files (streamed) included."""
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def fill(template: str, pk: Any) -> str:
    return "/" + template.replace("<pk>", str(pk))


def snapshot(obj: Any) -> Any:
    obj.refresh_from_db()
    return {k: v for k, v in obj.__dict__.items() if not k.startswith("_")}


# A write body aimed at the foreign tenant, per list route.
def foreign_create_body(name: str, org: Org, foreign: Tenant) -> dict[str, Any]:
    project = foreign.projects.first()
    return {
        "tenant-list": {"parent": foreign.pk, "slug": "intruder", "name": "Intruder"},
        "project-list": {"tenant": foreign.pk, "slug": "intruder", "name": "Intruder"},
        "membership-list": {"tenant": foreign.pk, "username": "alice", "role": "admin"},
        "quota-list": {
            "tenant": foreign.pk,
            "flavor": org.a100.pk,
            "guaranteed_milli": 0,
            "limit_milli": 0,
        },
        "prioritydefault-list": {
            "tenant": foreign.pk,
            "job_type": "training",
            "priority_class": "critical",
        },
        "job-list": {"project": project.pk, "spec": job_spec()},
        "quote": {"project": project.pk, "spec": job_spec()},
        "flavor-list": {"name": "X1-intruder", "memory_mib": 1},
        "approvalpolicy-list": {"tenant": foreign.pk, "rule": "gpus_over", "threshold": 1},
        "quotarequest-list": {
            "tenant": foreign.pk,
            "flavor": org.h100.pk,
            "guaranteed_milli": 16000,
            "limit_milli": 32000,
        },
        "priorityclass-list": {"name": "intruder", "value": 12345},
        "statement-close": {"organisation": foreign.pk, "month": "2031-01"},
        "budget-list": {"tenant": foreign.pk, "month": "2031-02-01", "limit": "10"},
        "costexport-list": {
            "from": "2031-01-31T20:00:00Z",
            "to": "2031-02-01T00:00:00Z",
            "tenant": foreign.pk,
        },
        "ratecard-list": {
            "flavor": org.h100.pk,
            "valid_from": "2031-01-01T00:00:00Z",
            "gpu_hour": "9",
        },
        "whatif-list": {
            "scope": foreign.pk,
            "changes": [
                {"kind": "quota", "tenant": foreign.slug, "flavor": "H100-80GB", "weight": 2}
            ],
        },
    }.get(name, {})


def counts() -> dict[str, int]:
    from tenants.models import PriorityClass, Project, ResourceFlavor

    models = [
        Tenant,
        Project,
        Membership,
        Quota,
        PriorityDefault,
        Job,
        ResourceFlavor,
        PriorityClass,
        ApprovalPolicy,
        ApprovalRequest,
        AuditEntry,
        WhatIf,
        PoolTarget,
        TcoInputs,
        RateSuggestion,
    ]
    return {m.__name__: m.objects.count() for m in models}


def rows() -> dict[str, list[dict[str, Any]]]:
    """Every row of the tenant data a request could change (counts() misses an update)."""
    from billing.models import BillingPolicy, RateCard, StatementLine
    from scheduler.models import Node
    from tenants.models import IdleRule, PriorityClass, Project, ResourceFlavor

    models = [
        Tenant,
        Project,
        Membership,
        Quota,
        PriorityDefault,
        PriorityClass,
        ResourceFlavor,
        ApprovalPolicy,
        ApprovalRequest,
        IdleRule,
        Job,
        Node,
        RateCard,
        Budget,
        Statement,
        StatementLine,
        BillingPolicy,
        CostExport,
        WhatIf,
        PoolTarget,
        TcoInputs,
        RateSuggestion,
    ]
    return {m.__name__: list(m.objects.order_by("pk").values()) for m in models}


def test_every_route_is_covered() -> None:
    routes = api_routes()
    assert len(routes) >= 15, [r.template for r in routes]
    for route in routes:
        base = basename(route)
        known = base in FOREIGN_OBJECTS or base in GLOBAL_DETAIL or base in NO_TENANT_DATA
        assert known, f"route {route.template} ({route.name}) has no isolation entry"


@pytest.mark.parametrize("persona", sorted(PERSONAS))
def test_persona_sees_and_changes_nothing_foreign(org: Org, client_for: Any, persona: str) -> None:
    add_personas(org)
    populate(org)
    populate_billing(org)
    foreign: Tenant = getattr(org, PERSONAS[persona])
    markers = NEVER_SEEN.get(persona, (MARKERS[PERSONAS[persona]],))
    client = walk_client(org, client_for, persona)
    before, rows_before = counts(), rows()
    for route in api_routes():
        base = basename(route)
        if route.is_detail and base in FOREIGN_OBJECTS:
            obj = FOREIGN_OBJECTS[base](org, foreign)
            assert obj is not None, f"no foreign object for {route.template}"
            state = snapshot(obj)
            url = fill(route.template, obj.pk)
            for method in route.methods:
                response = client.generic(method, url, data="{}", content_type="application/json")
                assert response.status_code == 404, (persona, method, url, response.status_code)
            assert snapshot(obj) == state, f"{persona} changed {url}"
        elif not route.is_detail and "GET" in route.methods:
            response = client.get("/" + route.template + LIST_QUERY.get(route.name, ""))
            shut = base in ADMIN_FEATURES and persona not in TENANT_ADMINS
            expected = 404 if shut else 200
            if (base in FORBIDDEN_FEATURES and persona not in TENANT_ADMINS) or (
                base in PLANNERS_ONLY
            ):
                expected = 403
            assert response.status_code == expected, (persona, route.template, response.status_code)
            if base not in NO_TENANT_DATA or base == "me":
                text = text_of(response)
                assert not [m for m in markers if m in text], (persona, route.template)
        if not route.is_detail and "POST" in route.methods and base not in NO_TENANT_DATA:
            body = foreign_create_body(route.name, org, foreign)
            response = client.post("/" + route.template, body, format="json")
            assert response.status_code in {400, 403, 404}, (
                persona,
                route.template,
                response.json(),
            )
            if route.name in NOT_FOUND_WRITES:
                assert response.status_code == 404, (persona, route.template, response.json())
    assert counts() == before, persona
    assert rows() == rows_before, "a refused request changed a row"


def test_finance_reads_everything_and_writes_nothing(org: Org, client_for: Any) -> None:
    populate(org)
    populate_billing(org)
    client = client_for("carol")
    before = counts()
    for route in api_routes():
        base = basename(route)
        if route.is_detail and base in FOREIGN_OBJECTS:
            obj = FOREIGN_OBJECTS[base](org, org.bravo)
            url = fill(route.template, obj.pk)
            state = snapshot(obj)
            for method in route.methods:
                if base in FINANCE_MANAGES and method not in {"GET", "HEAD"}:
                    continue
                response = client.generic(method, url, data="{}", content_type="application/json")
                expected = {200} if method in {"GET", "HEAD"} else {400, 403}
                if base in PERSONAL or base in TENANT_MEMBERS_ONLY:
                    expected = {404}
                assert response.status_code in expected, (method, url, response.status_code)
            assert snapshot(obj) == state
        elif not route.is_detail and "POST" in route.methods and base not in NO_TENANT_DATA:
            body = foreign_create_body(route.name, org, org.bravo)
            response = client.post("/" + route.template, body, format="json")
            expected = 400 if route.name in BOOKS_KEEPER_WRITES else 403
            if route.name in FINANCE_MANAGES:
                expected = 201
                before["AuditEntry"] += 1  # finance's budget, audited
            if route.name in OWN_WRITES:
                expected = 201
            assert response.status_code == expected, (route.template, response.json())
    listed = client.get("/api/v1/jobs/").json()
    assert {j["tenant_slug"] for j in listed["results"]} == {
        "team-alpha",
        "team-bravo",
        "team-charlie",
    }
    assert counts() == before


def test_platform_admin_sees_everything(org: Org, client_for: Any) -> None:
    populate(org)
    populate_billing(org)
    client = client_for("pat")
    for route in api_routes():
        base = basename(route)
        if route.is_detail and base in FOREIGN_OBJECTS and "GET" in route.methods:
            obj = FOREIGN_OBJECTS[base](org, org.bravo)
            expected = 404 if base in PERSONAL else 200
            assert client.get(fill(route.template, obj.pk)).status_code == expected
    tenants = {t["slug"] for t in client.get("/api/v1/tenants/").json()["results"]}
    assert tenants == {
        "acme",
        "research",
        "product",
        "team-alpha",
        "team-bravo",
        "team-charlie",
        "globex",
    }


# A role in acme over no metered usage: their statement lines are none.
NO_USAGE = {"gus"}


@pytest.mark.parametrize("persona", sorted(set(PERSONAS) - {"nobody"}))
def test_statement_shows_each_persona_only_their_part(
    org: Org, client_for: Any, persona: str
) -> None:
    """Everyone in acme reads acme's statement, but its lines and roll-up only as far as the
    cost API would show them; the foreign team's name appears nowhere."""
    add_personas(org)
    populate(org)
    statement = populate_billing(org)
    client = walk_client(org, client_for, persona)
    marker = MARKERS[PERSONAS[persona]]
    for url in [f"/api/v1/statements/{statement.pk}/", f"/api/v1/statements/{statement.pk}/lines/"]:
        response = client.get(url)
        assert response.status_code == 200, (persona, url, response.status_code)
        assert marker not in response.content.decode(), (persona, url)
    lines = client.get(f"/api/v1/statements/{statement.pk}/lines/").json()["results"]
    if persona in NO_USAGE:
        assert lines == [], persona
    else:
        assert lines, persona  # their own part is there
    finance = client_for("carol").get(f"/api/v1/statements/{statement.pk}/lines/").json()
    assert marker in str(finance["results"])  # the walk has teeth: the line exists


def test_a_user_without_a_role_reads_no_statement(org: Org, client_for: Any) -> None:
    add_personas(org)
    populate(org)
    statement = populate_billing(org)
    client = client_for("nobody")
    for url in [f"/api/v1/statements/{statement.pk}/", f"/api/v1/statements/{statement.pk}/lines/"]:
        assert client.get(url).status_code == 404, url
    assert client.get("/api/v1/statements/").json()["results"] == []


def test_department_admin_manages_teams_below(org: Org, client_for: Any) -> None:
    client = client_for("dana")
    quota = Quota.objects.get(tenant=org.bravo, flavor=org.h100)
    response = client.patch(
        f"/api/v1/quotas/{quota.pk}/", {"guaranteed_milli": 12000}, format="json"
    )
    assert response.status_code == 200, response.json()
    quota.refresh_from_db()
    assert quota.guaranteed_milli == 12000


@pytest.mark.parametrize(
    ("persona", "expected"),
    [("alice", 403), ("tina", 403), ("dana", 200), ("pat", 200)],
    ids=["member", "team-admin-own-team", "dept-admin", "platform-admin"],
)
def test_who_may_set_team_quota(org: Org, client_for: Any, persona: str, expected: int) -> None:
    quota = Quota.objects.get(tenant=org.alpha, flavor=org.h100)
    response = client_for(persona).patch(
        f"/api/v1/quotas/{quota.pk}/", {"limit_milli": 20000}, format="json"
    )
    assert response.status_code == expected, response.json()
    quota.refresh_from_db()
    assert quota.limit_milli == (20000 if expected == 200 else 32000)


def test_member_cancels_only_own_jobs(org: Org, client_for: Any) -> None:
    mine = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    teammate = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["tina"])
    client = client_for("alice")
    assert client.post(f"/api/v1/jobs/{teammate.pk}/cancel/").status_code == 403
    assert client.post(f"/api/v1/jobs/{mine.pk}/cancel/").status_code == 200
    teammate.refresh_from_db()
    mine.refresh_from_db()
    assert (mine.state, teammate.state) == (JobState.CANCELLED, JobState.QUEUED)
    admin = client_for("tina")
    assert admin.post(f"/api/v1/jobs/{teammate.pk}/cancel/").status_code == 200


# Open to anyone: the login that gives a token, and the API's documentation.
PUBLIC = {"api-token", "schema", "api-docs"}


def every_request(org: Org) -> Iterator[tuple[Route, str, str]]:
    """(route, method, url) for every route and method, detail routes aimed at team-alpha's
    objects (the platform-wide ones at the first of their kind)."""
    for route in api_routes():
        url = "/" + route.template + LIST_QUERY.get(route.name, "")
        if route.is_detail:
            obj = (
                FOREIGN_OBJECTS[basename(route)](org, org.alpha)
                if basename(route) in FOREIGN_OBJECTS
                else None
            )
            url = fill(route.template, obj.pk if obj is not None else 1)
        for method in route.methods:
            yield route, method, url


def test_anonymous_gets_nothing(org: Org) -> None:
    """Every route and method without credentials: refused (401 or 403), never data, and
    nothing changes."""
    from rest_framework.test import APIClient

    populate(org)
    populate_billing(org)
    client = APIClient()
    before, rows_before = counts(), rows()
    walked = 0
    for route, method, url in every_request(org):
        if basename(route) in PUBLIC:
            continue
        response = client.generic(method, url, data="{}", content_type="application/json")
        assert response.status_code in {401, 403}, (method, url, response.status_code)
        assert not [m for m in MARKERS if m in text_of(response)], (method, url)
        walked += 1
    assert walked >= 80, walked
    assert counts() == before
    assert rows() == rows_before, "a refused request changed a row"


def test_a_node_agent_calls_only_its_report(org: Org) -> None:
    """A node agent's token (`manage.py node_agent_token`) reports GPU readings for its node:
    every other route and method is a 403, so a token leaked from a GPU node reads no tenant's
    jobs, costs or users, not even empty lists."""
    add_personas(org)
    populate(org)
    populate_billing(org)
    client = token_client(org.users[AGENT])
    before, rows_before = counts(), rows()
    walked = 0
    for route, method, url in every_request(org):
        if basename(route) in PUBLIC or route.name == "node-report":
            continue
        response = client.generic(method, url, data="{}", content_type="application/json")
        assert response.status_code == 403, (method, url, response.status_code)
        assert not [m for m in MARKERS if m in text_of(response)], (method, url)
        walked += 1
    assert walked >= 80, walked
    assert counts() == before
    assert rows() == rows_before, "a refused request changed a row"
    report = {"node": AGENT_NODE, "driver_version": "550.54.15", "gpus": []}
    assert client.post("/api/v1/nodes/report/", report, format="json").status_code == 200
    elsewhere = {**report, "node": "n-elsewhere"}
    assert client.post("/api/v1/nodes/report/", elsewhere, format="json").status_code == 403


def test_what_the_added_personas_may_do(org: Org, client_for: Any) -> None:
    """The other side of the walk: each added persona does see and change what their role
    gives them, so that their walk above is not vacuous."""
    group_project = add_personas(org)
    populate(org)
    approval_policies.policy_set(
        user=org.users["pat"], tenant=org.alpha, rule="gpus_over", threshold=2
    )
    job, _ = job_submit(user=org.users["alice"], project=org.proj_alpha, payload=job_spec())
    own = ApprovalRequest.objects.get(subject_id=job.pk, kind="job")
    foreign = ApprovalRequest.objects.get(tenant=org.bravo)
    # april approves for team-alpha, and administers nothing there
    april = client_for("april")
    inbox = {r["tenant"] for r in april.get("/api/v1/approval-requests/inbox/").json()["results"]}
    assert inbox == {org.alpha.pk}
    assert april.post(f"/api/v1/approval-requests/{foreign.pk}/approve/").status_code == 404
    assert april.post(f"/api/v1/approval-requests/{own.pk}/approve/").status_code == 200
    body = {"tenant": org.alpha.pk, "username": "chris", "role": "member"}
    assert april.post("/api/v1/memberships/", body, format="json").status_code == 403
    # gus submits to his group's project, and sees nothing of the team above it
    gus = client_for("gus")
    assert [p["slug"] for p in gus.get("/api/v1/projects/").json()["results"]] == [
        "proj-charlie-ml"
    ]
    submitted = gus.post(
        "/api/v1/jobs/", {"project": group_project.pk, "spec": job_spec()}, format="json"
    )
    assert submitted.status_code == 201, submitted.json()
    assert gus.get(f"/api/v1/projects/{org.proj_charlie.pk}/").status_code == 404
    # nobody is logged in and holds nothing
    nobody = client_for("nobody")
    assert nobody.get("/api/v1/me/").json()["memberships"] == []
    for url in ["/api/v1/jobs/", "/api/v1/tenants/", "/api/v1/projects/"]:
        assert nobody.get(url).json()["results"] == [], url
    # alice's token is alice
    token = token_client(org.users["alice"])
    assert token.get("/api/v1/me/").json()["username"] == "alice"
    names = {j["name"] for j in token.get("/api/v1/jobs/").json()["results"]}
    assert names == {"job-team-alpha", job.name}
