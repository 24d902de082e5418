"""Quote API: `POST /api/v1/quotes/` with the body of a job submit; creates nothing."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.costs.quotes import job_quote
from scheduler.api.serializers import JobSubmitIn
from scheduler.api.views import spec_errors_under_spec, submit_envelope

MONEY_HELP = "A decimal string in the installation's currency; null when the runtime is unbounded."


class QuoteJobOut(serializers.Serializer):
    name = serializers.CharField()
    job_type = serializers.CharField()
    project = serializers.IntegerField()
    tenant = serializers.IntegerField()
    priority_class = serializers.CharField(help_text="The class it would run at.")
    priority_note = serializers.CharField(
        help_text="Why it would run at another class than asked (a budget's policy), or ''.",
        allow_blank=True,
    )
    replicas = serializers.IntegerField()
    gpus_total = serializers.FloatField()
    flavors = serializers.ListField(child=serializers.CharField())
    max_runtime_s = serializers.IntegerField(allow_null=True)


class FlavorPriceOut(serializers.Serializer):
    flavor = serializers.CharField()
    cluster = serializers.CharField(
        allow_null=True,
        help_text="The cluster whose card prices it (a job that requires clusters); null: the "
        "default card.",
    )
    per_hour = serializers.CharField()


class EstimateOut(serializers.Serializer):
    currency = serializers.CharField()
    low = serializers.CharField(allow_null=True, help_text=MONEY_HELP)
    high = serializers.CharField(
        allow_null=True, help_text="The worst case (worst_case_cost). " + MONEY_HELP
    )
    per_hour_low = serializers.CharField(help_text="Cheapest flavor, submitted replicas.")
    per_hour_high = serializers.CharField(help_text="Dearest flavor, most replicas.")
    low_runtime_s = serializers.IntegerField(allow_null=True)
    high_runtime_s = serializers.IntegerField(
        allow_null=True, help_text="Every attempt's maximum runtime together."
    )
    attempts_max = serializers.IntegerField(
        help_text="The most attempts: retry.limit + 1, each with a fresh max_runtime_s."
    )
    replicas_max = serializers.IntegerField(
        help_text="The most replicas (an inference job's max_replicas)."
    )
    worst_case_cost = serializers.CharField(
        allow_null=True,
        help_text="attempts_max x max_runtime_s on the dearest flavor at replicas_max: what "
        "budgets reserve and cost rules judge. " + MONEY_HELP,
    )
    worst_case_note = serializers.CharField(help_text="The worst case in a sentence.")
    flavors = FlavorPriceOut(many=True)
    unpriced_flavors = serializers.ListField(child=serializers.CharField())
    cards_note = serializers.CharField(
        allow_blank=True,
        help_text="Which cards price it: the required clusters' own, or the default card and "
        "which clusters' own cards apply if placed there; '' when no cluster has its own.",
    )


class RuleMatchOut(serializers.Serializer):
    policy = serializers.IntegerField(allow_null=True)
    rule = serializers.CharField()
    reason = serializers.CharField()


class ApprovalOut(serializers.Serializer):
    needed = serializers.BooleanField()
    reasons = RuleMatchOut(many=True)


class BudgetOut(serializers.Serializer):
    tenant = serializers.CharField(help_text="The budget's tenant: the job's or an ancestor.")
    unit = serializers.CharField(help_text="money or gpu_hours")
    currency = serializers.CharField(allow_null=True)
    month = serializers.CharField()
    limit = serializers.CharField()
    spent = serializers.CharField()
    committed = serializers.CharField()
    remaining = serializers.CharField(help_text="Left before this job; may be negative.")
    percent = serializers.CharField()
    policy = serializers.CharField()
    job_projected = serializers.CharField(help_text="What this job would reserve.")
    remaining_after = serializers.CharField(help_text="Left once this job is reserved.")


class RefusalOut(serializers.Serializer):
    reason = serializers.CharField(
        help_text="What a submit would answer (its 409): the budget, its spend, committed and "
        "limit, and the job's worst case."
    )
    budget = BudgetOut(
        allow_null=True,
        help_text="The refusing budget (the job's tenant's or an ancestor's) as it stands; "
        "null if it was deleted meanwhile.",
    )


class QuoteOut(serializers.Serializer):
    job = QuoteJobOut()
    estimate = EstimateOut()
    approval = ApprovalOut(
        help_text="As submit would judge it; not judged (needed false, no reasons) when "
        "`refused`: submit stops at the refusal."
    )
    budget = BudgetOut(allow_null=True)
    fits = serializers.BooleanField(
        help_text="Always true in a quote: a job that can never run is a 400, as at submit."
    )
    refused = RefusalOut(
        allow_null=True,
        help_text="Why a submit would be refused now (a hard budget), so that the job can be "
        "changed first; null when a submit would be taken. A quote is a question: it is a "
        "200 either way.",
    )


class QuoteView(APIView):
    """What a job would cost, whether it would need approval and why, the budget left, and
    whether a submit would be refused and why, before anything is created. Validated exactly
    as a submit: the same 400s, a 404 for a project the user cannot see, a 403 for one they
    may see but not submit to; a job a hard budget would refuse is a 200 with `refused`."""

    @extend_schema(request=JobSubmitIn, responses={200: QuoteOut}, operation_id="quote_create")
    def post(self, request: Request) -> Response:
        project, data = submit_envelope(request)
        with spec_errors_under_spec():
            quote = job_quote(user=request.user, project=project, payload=data["spec"])
        return Response(quote.as_json())
