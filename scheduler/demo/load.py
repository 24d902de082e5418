"""A small load generator for the demo: jobs from several teams so queues, preemption and
dashboards move. Runs inside the daemon process, on the daemon's clock; submits through
`job_submit` like any user would. It keeps the queue short (at most `max_queued` waiting).

It runs after each cycle (the daemon's `on_cycle`), so what it raises fails the cycle: a
submission the installation refuses (a per-user cap of 0, a flavor renamed or removed, a
project its user left) is skipped and said once per template and reason, at warning.

Its jobs stay under the demo's approval policies (scheduler/demo/seed.py's POLICIES): each
declares a maximum runtime (product's policy sends jobs without one, or over 48 hours, to its
approvers), none asks for more than NLP's 16 GPUs or runs at `critical`. A policy an admin
adds may still catch some; then a template waits while its last job waits for approval, so
the approvers' inbox holds at most one request per template, however long the demo runs.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import APIException

from common.errors import DomainError
from scheduler.jobs.services import job_submit
from scheduler.jobs.spec import MIN_MAX_RUNTIME_S
from scheduler.models import Job, JobState
from tenants.models import Project

log = logging.getLogger("gantry.demo")

# The maximum runtime a template's jobs declare: twice their longest simulated run (a
# preempted job's next attempt gets a fresh maximum), far under the demo's 48-hour policy,
# and never under the spec's least (MIN_MAX_RUNTIME_S: templates sped up, as bench.eta's
# demo runs them, would be refused).
MAX_RUNTIME_FACTOR = 2

# submitter, project, name, type, replicas, gpus, flavor, (min, max) duration s, extra spec
Template = tuple[str, str, str, str, int, int, str, tuple[int, int], dict[str, Any]]
TEMPLATES: list[Template] = [
    ("ana", "llm-pretrain", "pretrain", "training", 1, 8, "H100-80GB", (240, 900), {}),
    (
        "ana",
        "llm-pretrain",
        "sft",
        "fine-tuning",
        1,
        4,
        "H100-80GB",
        (120, 480),
        {"checkpointable": True},
    ),
    ("ana", "nlp-eval", "eval", "evaluation", 1, 1, "A100-40GB", (30, 180), {}),
    (
        "vik",
        "detector",
        "detector-train",
        "training",
        2,
        4,
        "A100-40GB",
        (180, 600),
        {"retry": {"limit": 2, "backoff_s": 10}},
    ),
    ("vik", "detector", "augment", "batch", 1, 2, "A100-40GB", (60, 240), {}),
    ("sam", "ranker", "ranker-scoring", "batch", 2, 1, "T4-16GB", (60, 300), {}),
    (
        "ada",
        "chat-serving",
        "chat-canary",
        "inference",
        1,
        1,
        "L40S-48GB",
        (300, 900),
        {"min_replicas": 1, "max_replicas": 3},
    ),
]

# What job_submit refuses with: bad input or a rule (a quota, a budget), no permission.
REFUSED = (APIException, DjangoValidationError, PermissionDenied, DomainError)


class DemoLoad:
    def __init__(
        self,
        clock: Callable[[], float],
        every_s: float = 15.0,
        max_queued: int = 12,
        seed: int | None = None,
        templates: list[Template] | None = None,
    ) -> None:
        self.clock, self.every_s, self.max_queued = clock, every_s, max_queued
        self.templates = templates or TEMPLATES
        self.refused: set[tuple[str, str]] = set()  # (template, reason) already said
        self.rng = random.Random(seed)  # noqa: S311 - demo data
        self.next_at = clock()
        self.count = 0
        self.awaiting: dict[str, int] = {}  # template -> its job that waits for approval

    def tick(self, *_args: Any) -> None:
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + self.rng.uniform(0.5, 1.5) * self.every_s
        if Job.objects.filter(state=JobState.QUEUED).count() >= self.max_queued:
            return
        template = self.rng.choice(self.templates)
        user_name, project_slug, name, kind, replicas, gpus, flavor, span, extra = template
        if self._awaits_approval(name):
            return
        user = get_user_model().objects.filter(username=user_name).first()
        project = Project.objects.filter(slug=project_slug).first()
        if user is None or project is None:
            return
        self.count += 1
        spec: dict[str, Any] = {
            "name": f"{name}-{self.count}",
            "type": kind,
            "replicas": replicas,
            "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "command": ["python", "-m", name],
            "resources": {"gpus": gpus, "cpu_milli": 4000 * gpus, "memory_mib": 16384 * gpus},
            "flavors": [flavor],
            "simulation": {"duration_s": self.rng.randint(*span), "fail": self.rng.random() < 0.05},
            "max_runtime_s": max(MIN_MAX_RUNTIME_S, MAX_RUNTIME_FACTOR * span[1]),
            **extra,
        }
        try:
            job, _ = job_submit(user=user, project=project, payload=spec)
        except REFUSED as refusal:
            self._refused(name, user_name, refusal)
            return
        if job.state == JobState.PENDING_APPROVAL:
            self.awaiting[name] = job.pk
        log.info("demo load: %s submitted %s", user_name, job)

    def _awaits_approval(self, template: str) -> bool:
        """Whether the template's last job still waits for approval (then it submits none)."""
        job_id = self.awaiting.get(template)
        if job_id is None:
            return False
        if Job.objects.filter(pk=job_id, state=JobState.PENDING_APPROVAL).exists():
            return True
        del self.awaiting[template]
        return False

    def _refused(self, template: str, user_name: str, refusal: Exception) -> None:
        """Say a refusal once per template and reason; later ones at debug."""
        detail = refusal.detail if isinstance(refusal, APIException) else None
        reason = "; ".join(_messages(detail)) if detail is not None else str(refusal)
        reason = reason[:500]
        first = (template, reason) not in self.refused
        self.refused.add((template, reason))
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "demo load: %s's %s job was refused, skipped: %s",
            user_name,
            template,
            reason,
        )


def _messages(detail: object, field: str = "") -> list[str]:
    """A DRF error detail as "field: message" lines."""
    if isinstance(detail, dict):
        return [m for key, value in detail.items() for m in _messages(value, str(key))]
    if isinstance(detail, list):
        return [m for value in detail for m in _messages(value, field)]
    return [f"{field}: {detail}" if field else str(detail)]
