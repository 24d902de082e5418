"""The idle email: to a job's owner and the admins of its tenant (and of the tenants above,
whose admin role covers it), once per idle episode."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.urls import reverse

from common.words import minutes
from scheduler.models import Job, JobIdle
from scheduler.telemetry.idle import rule_for_tenants
from tenants.models import IdleAction, JobType, Membership, Role


def _recipients(job: Job) -> list[str]:
    admins = Membership.objects.filter(
        tenant_id__in=job.tenant.ancestor_ids(), role=Role.ADMIN
    ).values_list("user__email", flat=True)
    found = [job.submitted_by.email, *admins]
    return sorted({address for address in found if address})


def _message(job: Job, episode: datetime) -> tuple[str, str]:
    rule = rule_for_tenants([job.tenant_id])[job.tenant_id]
    link = settings.GANTRY_BASE_URL.rstrip("/") + reverse("portal:job-detail", args=[job.pk])
    lines = [
        f"Job {job.name} (#{job.pk}) in '{job.tenant.slug}' holds GPUs that have stayed under "
        f"{rule.threshold_pct:g} % utilization since {episode:%Y-%m-%d %H:%M} UTC "
        f"({minutes(rule.duration_s)} or more).",
    ]
    if rule.action == IdleAction.NOTIFY_AND_STOP and job.job_type == JobType.INTERACTIVE:
        lines.append("Interactive jobs are stopped when idle this long: this one was stopped.")
    else:
        lines.append("If it no longer needs them, cancel it so that others can use them.")
    lines.append(f"See it at {link}")
    return f"[Gantry] job {job.name} is idle", "\n".join(lines) + "\n"


@transaction.atomic
def idle_notification_send(job_id: int, episode: datetime) -> bool:
    """Email about the job's idle episode starting at `episode`, unless already sent for it
    (the row lock and `notified_for` make a task delivered twice send once; a mail error
    rolls the mark back, so a retry sends it). Returns whether an email went out."""
    state = JobIdle.objects.select_for_update().filter(job_id=job_id).first()
    if state is None or state.notified_for == episode:
        return False
    job = Job.objects.select_related("tenant", "submitted_by").get(pk=job_id)
    recipients = _recipients(job)
    if recipients:
        subject, body = _message(job, episode)
        send_mail(subject, body, None, recipients)
    state.notified_for = episode
    state.save(update_fields=["notified_for"])
    return bool(recipients)
