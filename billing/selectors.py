"""Reads of billing for the API and the portal, filtered to what the user may see.

Who sees which costs (issue 18):
- finance and platform admins: everything;
- a tenant admin: every line of their subtree (idle reserved capacity and adjustments too);
- a member (or approver): the lines of their teams' projects, and of their own jobs;
- nothing else: lines outside are left out, and a statement of an organisation the user holds
  no role in is a 404 (`access_statement`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import Http404

from billing.costs.lines import CostLine, organisation_costs
from billing.models import BillingPolicy, LineKind, Statement, StatementLine, UsageRecord
from billing.rates.cards import flavor_renames
from billing.statements.rollup import SplitsMemo
from tenants import access
from tenants.models import Project, Role, Tenant, TenantKind

DIMENSIONS = (
    "department",
    "team",
    "project",
    "user",
    "flavor",
    "job_type",
    "priority_class",
    # The cluster the usage ran on, or idle reserved capacity lies on, by name (issue 38).
    "cluster",
)


def _root(path: str) -> int:
    return int(path.strip("/").split("/")[0])


def organisations_visible(user: Any) -> QuerySet[Tenant]:
    """Organisations (roots) the user holds any role in, or all of them."""
    grants = access.grants_for(user)
    roots = Tenant.objects.filter(parent__isnull=True)
    if grants.sees_everything:
        return roots
    return roots.filter(pk__in={_root(path) for path in grants.roles_by_path})


@dataclass(frozen=True)
class LineFilter:
    """Which cost lines a request asks for (None: any)."""

    tenant: Tenant | None = None
    project: int | None = None
    flavor: str | None = None
    kind: str | None = None

    def keeps(self, line: CostLine, paths: dict[int, str]) -> bool:
        return (
            (self.tenant is None or paths[line.tenant].startswith(self.tenant.path))
            and (self.project is None or line.project == self.project)
            and (self.flavor is None or line.flavor == self.flavor)
            and (self.kind is None or line.kind == self.kind)
        )


def line_filter_for(query: dict[str, Any]) -> LineFilter:
    """The filters of a validated cost query (the cost API's and its exports')."""
    tenant = None
    if query.get("tenant") is not None:
        tenant = Tenant.objects.filter(pk=query["tenant"]).first()
        if tenant is None:  # as for a tenant not visible: nothing
            tenant = Tenant(pk=0, path="/0/")  # no tenant's path: nothing matches
    return LineFilter(
        tenant=tenant,
        project=query.get("project"),
        flavor=query.get("flavor"),
        kind=query.get("kind"),
    )


def line_visibility(user: Any) -> Any:
    """A predicate (line, tenant paths) -> may `user` see the line."""
    grants = access.grants_for(user)
    if grants.sees_everything:
        return lambda line, paths: True
    admin = tuple(p for p, role in grants.roles_by_path.items() if role == Role.ADMIN)
    member = tuple(grants.roles_by_path)

    def visible(line: CostLine, paths: dict[int, str]) -> bool:
        path = paths[line.tenant]
        return (
            path.startswith(admin)
            or line.user == user.pk
            or (line.project is not None and path.startswith(member))
        )

    return visible


def cost_lines_visible(
    user: Any,
    start: datetime,
    end: datetime,
    lines_filter: LineFilter | None = None,
    *,
    splits: SplitsMemo | None = None,
) -> list[CostLine]:
    """The cost lines of [start, end) the user may see, filtered. `splits`: the cluster's
    hour splits, shared with the caller's other reads of the same windows
    (statements.SplitsMemo)."""
    lines_filter = lines_filter or LineFilter()
    organisations = set(organisations_visible(user))
    if not access.grants_for(user).sees_everything:
        # Own jobs in an organisation where the user holds no role any more.
        own = UsageRecord.objects.filter(
            user_id=user.pk, period__start__gte=start, period__start__lt=end
        ).values_list("tenant__path", flat=True)
        organisations |= set(Tenant.objects.filter(pk__in={_root(p) for p in own.distinct()}))
    if lines_filter.tenant is not None:
        organisations = {o for o in organisations if o.pk == _root(lines_filter.tenant.path)}
    paths = dict(Tenant.objects.values_list("id", "path"))
    visible = line_visibility(user)
    if splits is None:
        splits = {}  # the cluster's splits, computed once for every organisation
    renames = flavor_renames()
    return [
        line
        for organisation in sorted(organisations, key=lambda o: o.pk)
        for line in _renamed(organisation_costs(organisation, start, end, splits=splits), renames)
        if visible(line, paths) and lines_filter.keeps(line, paths)
    ]


def _renamed(lines: Iterable[CostLine], renames: dict[str, str]) -> Iterator[CostLine]:
    """Lines recorded under a flavor's former name (closed lines, idle capacity) under its
    name now: a line follows its flavor, and a filter by the flavor finds it."""
    for line in lines:
        yield replace(line, flavor=renames[line.flavor]) if line.flavor in renames else line


@dataclass
class CostRow:
    key: int | str | None
    name: str | None
    charged: Decimal = Decimal("0.00")
    showback: Decimal = Decimal("0.00")
    # Every line's GPU-hours (the cost API's `gpu_hours`), and apart: those jobs held (used,
    # preempted, failed) and idle reserved capacity (charged or showback). Allocated-but-idle
    # showback is GPU time jobs held, counted in `gpu_hours_used` already.
    gpu_hours: Fraction = field(default_factory=Fraction)
    gpu_hours_used: Fraction = field(default_factory=Fraction)
    gpu_hours_idle_reserved: Fraction = field(default_factory=Fraction)
    # The cluster of a row split per cluster (`aggregate_per_cluster`); None: every cluster.
    cluster: str | None = None


JOB_KINDS = frozenset({LineKind.USED, LineKind.PREEMPTED, LineKind.FAILED})


class _Hours:
    """A row's exact GPU-hour sums (`_add`), all lines and per kind of line."""

    def __init__(self) -> None:
        self.all: dict[int, int] = {}
        self.used: dict[int, int] = {}
        self.idle_reserved: dict[int, int] = {}

    def add(self, line: CostLine) -> None:
        _add(self.all, line.gpu_hours)
        if line.kind in JOB_KINDS:
            _add(self.used, line.gpu_hours)
        elif line.kind == LineKind.IDLE_RESERVED:
            _add(self.idle_reserved, line.gpu_hours)

    def fill(self, row: CostRow) -> None:
        row.gpu_hours = _sum(self.all)
        row.gpu_hours_used = _sum(self.used)
        row.gpu_hours_idle_reserved = _sum(self.idle_reserved)


def _nearest(kind: str, tenants: dict[int, Tenant]) -> dict[int, int | None]:
    """tenant id -> its nearest ancestor (or itself) of `kind`, or None."""
    out: dict[int, int | None] = {}
    for tenant in tenants.values():
        found = [t for t in tenant.ancestor_ids() if t in tenants and tenants[t].kind == kind]
        out[tenant.pk] = found[-1] if found else None
    return out


def aggregate(lines: Iterable[CostLine], by: str) -> list[CostRow]:
    """Cost lines added up per value of the dimension `by`, largest charged first."""
    lines = list(lines)
    tenants = {t.pk: t for t in Tenant.objects.all()}
    if by in ("department", "team"):
        nearest = _nearest(
            TenantKind.DEPARTMENT if by == "department" else TenantKind.TEAM, tenants
        )
        names: dict[Any, str] = {pk: t.slug for pk, t in tenants.items()}
        key_of: Any = lambda line: nearest[line.tenant]  # noqa: E731
    elif by == "project":
        names = dict(Project.objects.values_list("id", "slug"))
        key_of = lambda line: line.project  # noqa: E731
    elif by == "user":
        names = dict(get_user_model().objects.values_list("id", "username"))
        key_of = lambda line: line.user  # noqa: E731
    else:
        names = {}
        key_of = lambda line: getattr(line, by) or None  # noqa: E731
    rows: dict[Any, CostRow] = {}
    hours: dict[Any, _Hours] = {}
    for line in lines:
        key = key_of(line)
        row = rows.get(key)
        if row is None:
            row = rows[key] = CostRow(key, names.get(key, key) if key is not None else None)
            hours[key] = _Hours()
        if line.charged:
            row.charged += line.amount
        else:
            row.showback += line.amount
        hours[key].add(line)
    for key, row in rows.items():
        hours[key].fill(row)
    return sorted(rows.values(), key=lambda r: (-r.charged, -r.showback, str(r.name)))


def aggregate_per_cluster(lines: Iterable[CostLine], by: str) -> list[CostRow]:
    """`aggregate` split per cluster: a row per value of `by` and cluster (`CostRow.cluster`,
    the lines' cluster name), the groups in `aggregate`'s order (largest charged first), each
    group's clusters by name; where the lines name one cluster at most, a row per group named
    with it. By "cluster" itself, `aggregate`'s rows with their cluster."""
    lines = list(lines)
    groups = aggregate(lines, by)
    if by == "cluster":
        return [replace(row, cluster=row.name or "") for row in groups]
    named = {line.cluster for line in lines if line.cluster}
    if len(named) <= 1:
        # One cluster (or none named): a row per group, as before there were clusters. The
        # lines that name none (usage of before clusters, adjustments) are that
        # installation's too, and a second row per group for them would only halve every
        # group.
        only = next(iter(named), "")
        return [replace(row, cluster=only) for row in groups]
    order = {row.key: i for i, row in enumerate(groups)}
    parts: dict[str, list[CostLine]] = {}
    for line in lines:
        parts.setdefault(line.cluster, []).append(line)
    rows = [
        replace(row, cluster=cluster)
        for cluster, part in parts.items()
        for row in aggregate(part, by)
    ]
    return sorted(rows, key=lambda r: (order[r.key], r.cluster or ""))


def totals(lines: Iterable[CostLine]) -> CostRow:
    total = CostRow(None, None)
    hours = _Hours()
    for line in lines:
        if line.charged:
            total.charged += line.amount
        else:
            total.showback += line.amount
        hours.add(line)
    hours.fill(total)
    return total


def _add(sums: dict[int, int], value: Fraction) -> None:
    """Add `value` to an exact sum kept as numerators per denominator: the lines' GPU-hours
    have few denominators (units over an hour of microseconds), so adding integers and
    making one fraction per denominator at the end is exact and avoids a gcd per line."""
    sums[value.denominator] = sums.get(value.denominator, 0) + value.numerator


def _sum(sums: dict[int, int]) -> Fraction:
    return sum((Fraction(n, d) for d, n in sums.items()), Fraction(0))


# --- statements ----------------------------------------------------------------------------


def statement_list_visible(user: Any) -> QuerySet[Statement]:
    return Statement.objects.filter(organisation__in=organisations_visible(user)).select_related(
        "organisation", "closed_by"
    )


def access_statement(user: Any, statement_id: Any) -> Statement:
    """A statement of an organisation the user holds a role in (or any, for finance and
    platform admins); anything else is a 404."""
    try:
        return statement_list_visible(user).get(pk=int(statement_id))
    except (ValueError, TypeError, Statement.DoesNotExist):
        raise Http404("Not found.") from None


def statement_lines_visible(user: Any, statement: Statement) -> list[StatementLine]:
    """The statement's lines the user may see, with the same rule as the cost API's."""
    paths = dict(Tenant.objects.values_list("id", "path"))
    visible = line_visibility(user)
    rows = statement.lines.select_related("tenant", "project", "user", "author").order_by("id")
    return [row for row in rows if visible(_as_cost(statement, row), paths)]


def _as_cost(statement: Statement, row: StatementLine) -> CostLine:
    return CostLine(
        statement.organisation_id,
        row.tenant_id,
        row.project_id,
        row.user_id,
        row.flavor,
        row.resource,
        row.kind,
        "",
        "",
        row.amount,
        Fraction(0),
        row.charged,
    )


def rolled_up_tenants(user: Any, organisation: Tenant) -> list[Tenant]:
    """The tenants of `organisation` whose whole subtree the user may see: every one for
    finance and platform admins, the subtrees a tenant admin holds; none for members, whose
    view of a team leaves out what is not theirs (a partial total would mislead)."""
    grants = access.grants_for(user)
    tenants = Tenant.objects.filter(path__startswith=organisation.path).order_by("path")
    if grants.sees_everything:
        return list(tenants)
    return list(tenants.filter(grants.subtree_q(min_role=Role.ADMIN)))


def billing_policies_visible(user: Any) -> list[tuple[Tenant, str]]:
    """(organisation, idle policy) for finance and platform admins; nothing for others."""
    if not access.grants_for(user).sees_everything:
        return []
    policies = dict(BillingPolicy.objects.values_list("organisation_id", "idle_policy"))
    return [
        (organisation, policies.get(organisation.pk, "charge"))
        for organisation in Tenant.objects.filter(parent__isnull=True).order_by("slug")
    ]


# --- the finance page ----------------------------------------------------------------------


@dataclass(frozen=True)
class TenantCost:
    tenant: Tenant
    level: int  # depth below the first row shown, for indentation
    charged: Decimal
    showback: Decimal


@dataclass(frozen=True)
class LeavesCheck:
    """Reconciliation 1 for one top tenant: its lines (each on one node of its subtree)
    added up equal its rolled-up total, to the cent."""

    tenant: Tenant
    lines_sum: Decimal
    total: Decimal

    @property
    def ok(self) -> bool:
        return self.lines_sum == self.total


def tenant_costs(
    user: Any,
    start: datetime,
    end: datetime,
    top: Tenant | None = None,
    *,
    lines: list[CostLine] | None = None,
) -> tuple[list[TenantCost], list[LeavesCheck]]:
    """Cost per tenant node over [start, end) for the nodes whose subtree the user sees
    whole (under `top` when given), and the leaves-to-root check of each topmost node.
    `lines`: `cost_lines_visible`'s for the same window and `top`, when the caller has them
    already (the costs page rates a month once for its table and its charts)."""
    from billing.statements.rollup import roll_up

    if lines is None:
        lines = cost_lines_visible(user, start, end, LineFilter(tenant=top))
    totals = roll_up((line.tenant, line.amount, line.charged) for line in lines)
    tenants = [
        t
        for organisation in organisations_visible(user)
        for t in rolled_up_tenants(user, organisation)
        if top is None or t.path.startswith(top.path)
    ]
    tenants.sort(key=lambda t: t.path)
    tops = [t for t in tenants if not any(t.path.startswith(o.path) and o != t for o in tenants)]
    rows = [
        TenantCost(
            t,
            t.depth - max(o.depth for o in tops if t.path.startswith(o.path)),
            totals[t.pk].charged if t.pk in totals else Decimal("0.00"),
            totals[t.pk].showback if t.pk in totals else Decimal("0.00"),
        )
        for t in tenants
    ]
    paths = dict(Tenant.objects.values_list("id", "path"))
    checks = [
        LeavesCheck(
            t,
            sum(
                (
                    line.amount
                    for line in lines
                    if line.charged and paths[line.tenant].startswith(t.path)
                ),
                Decimal("0.00"),
            ),
            totals[t.pk].charged if t.pk in totals else Decimal("0.00"),
        )
        for t in tops
    ]
    return rows, checks
