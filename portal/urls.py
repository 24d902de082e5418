"""Portal routes. Every route taking an id resolves it through `tenants.access` or a selector,
and tests/portal/test_isolation_walk.py walks this list, so a new route needs an entry there."""

from django.urls import path

from portal.views import (
    approvals,
    audit,
    auth,
    capacity,
    cost_exports,
    costs,
    home,
    job_logs,
    jobs,
    nodes,
    profile,
    tenants,
)
from portal.views import tenant_notifications as notify
from portal.views.clusters import cluster_action, cluster_list
from portal.views.dashboards import dashboard_cluster, dashboard_tenant
from portal.views.rate_cards import rate_cards
from portal.views.tenant_registries import tenant_registries
from portal.views.whatifs import (
    approval_whatif,
    whatif_detail,
    whatif_list,
    whatif_new,
    whatif_status,
)

app_name = "portal"

urlpatterns = [
    path("accounts/login/", auth.PortalLoginView.as_view(), name="login"),
    path("accounts/logout/", auth.PortalLogoutView.as_view(), name="logout"),
    path("", home.home, name="home"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/rows/", jobs.job_rows, name="job-rows"),
    path("jobs/new/", jobs.job_new, name="job-new"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job-detail"),
    path("jobs/<int:pk>/status/", jobs.job_status, name="job-status"),
    path("jobs/<int:pk>/logs/", job_logs.job_logs, name="job-logs"),
    path("jobs/<int:pk>/cancel/", jobs.job_cancel_view, name="job-cancel"),
    path("tenants/", tenants.tenant_list, name="tenants"),
    path("tenants/<int:pk>/", tenants.tenant_detail, name="tenant-detail"),
    path("tenants/<int:pk>/members/", tenants.tenant_members, name="tenant-members"),
    path(
        "tenants/<int:pk>/members/<int:membership_pk>/role/",
        tenants.tenant_member_role,
        name="tenant-member-role",
    ),
    path(
        "tenants/<int:pk>/members/<int:membership_pk>/remove/",
        tenants.tenant_member_remove,
        name="tenant-member-remove",
    ),
    path("tenants/<int:pk>/dashboard/", dashboard_tenant, name="tenant-dashboard"),
    path("tenants/<int:pk>/quotas/", tenants.tenant_quotas, name="tenant-quotas"),
    path("tenants/<int:pk>/priorities/", tenants.tenant_priorities, name="tenant-priorities"),
    path("tenants/<int:pk>/policies/", tenants.tenant_policies, name="tenant-policies"),
    path(
        "tenants/<int:pk>/policies/<int:policy_pk>/delete/",
        tenants.tenant_policy_delete,
        name="tenant-policy-delete",
    ),
    path(
        "tenants/<int:pk>/notifications/",
        notify.tenant_notifications,
        name="tenant-notifications",
    ),
    path(
        "tenants/<int:pk>/notifications/idle-rule/delete/",
        notify.tenant_idle_rule_delete,
        name="tenant-idle-rule-delete",
    ),
    path("tenants/<int:pk>/registries/", tenant_registries, name="tenant-registries"),
    path("tenants/<int:pk>/notifications/webhook/", notify.tenant_webhook, name="tenant-webhook"),
    path(
        "tenants/<int:pk>/notifications/webhook/secret/",
        notify.tenant_webhook_secret,
        name="tenant-webhook-secret",
    ),
    path(
        "tenants/<int:pk>/notifications/webhook/test/",
        notify.tenant_webhook_test,
        name="tenant-webhook-test",
    ),
    path("approvals/", approvals.approval_inbox, name="approvals"),
    path("approvals/history/", approvals.approval_history, name="approval-history"),
    path("approvals/<int:pk>/decide/", approvals.approval_decide, name="approval-decide"),
    path("approvals/<int:pk>/what-if/", approval_whatif, name="approval-whatif"),
    path("what-ifs/", whatif_list, name="whatifs"),
    path("what-ifs/new/", whatif_new, name="whatif-new"),
    path("what-ifs/<int:pk>/", whatif_detail, name="whatif-detail"),
    path("what-ifs/<int:pk>/status/", whatif_status, name="whatif-status"),
    path("capacity/", capacity.capacity_page, name="capacity"),
    path("capacity/export/", capacity.capacity_export, name="capacity-export"),
    path("capacity/tco/", capacity.capacity_tco, name="capacity-tco"),
    path("capacity/expansions/", capacity.capacity_expansion, name="capacity-expansion"),
    path("capacity/target/", capacity.capacity_target, name="capacity-target"),
    path("capacity/suggestions/", capacity.capacity_suggest, name="capacity-suggest"),
    path(
        "capacity/suggestions/<int:pk>/decide/",
        capacity.capacity_suggestion_decide,
        name="capacity-suggestion-decide",
    ),
    path("audit/", audit.audit_log, name="audit"),
    path("audit/export.csv", audit.audit_export, name="audit-export"),
    path("costs/", costs.costs, name="costs"),
    path("costs/exports/", cost_exports.cost_export_new, name="cost-export-new"),
    path("costs/rate-cards/", rate_cards, name="rate-cards"),
    path("costs/exports/<int:pk>/", cost_exports.cost_export_status, name="cost-export-status"),
    path(
        "costs/exports/<int:pk>/download/",
        cost_exports.cost_export_download,
        name="cost-export-download",
    ),
    path("dashboards/cluster/", dashboard_cluster, name="dashboard-cluster"),
    path("scheduler/profile/", profile.scheduler_profile, name="scheduler-profile"),
    path("nodes/", nodes.node_list, name="nodes"),
    path("nodes/<int:pk>/", nodes.node_detail, name="node-detail"),
    path("nodes/<int:pk>/action/", nodes.node_action, name="node-action"),
    path("clusters/", cluster_list, name="clusters"),
    path("clusters/<int:pk>/action/", cluster_action, name="cluster-action"),
]
