"""Wait reasons and event messages as one viewer may read them.

The daemon writes one text per job ("preempting job(s) 12, 40; starts when they have
stopped", "waiting for reservation of job 7, expected in 3 min", "preempted: best-effort job
gives way to job 9"), and the job's readers are not all allowed to see the jobs it names:
a member of team A whose job reclaims from team B must not learn B's job ids. So the ids are
rewritten where the text is shown (portal, API, and the CLI through the API): those the
viewer may not see become "a job of another team".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from scheduler.jobs.selectors import job_ids_visible
from scheduler.models import Job
from tenants import access
from tenants.models import Tenant

# "job 7", "job(s) 12, 40", and the victim of an elastic shrink ("replicas of 12").
_MENTION = re.compile(r"\b(?P<lead>job\(s\)|job|replicas of) (?P<ids>\d+(?:, \d+)*)\b")
OTHER_TEAM = "a job of another team"
# The texts the engine writes that name a tenant, maybe another than the reader's
# (`core.cycle._why`, the plans of `core.plans`): a reclaim, and a preemption by priority.
_NAMES_TENANT = re.compile(r"reclaims its guarantee from |of higher priority in ")


def mentioned_ids(texts: Iterable[str]) -> set[int]:
    return {int(part) for text in texts for m in _MENTION.finditer(text) for part in _ids(m)}


def redact(text: str, visible: set[int]) -> str:
    """``text`` with every job id outside ``visible`` replaced by a phrase without it."""

    def mention(m: re.Match[str]) -> str:
        ids = _ids(m)
        shown = [i for i in ids if int(i) in visible]
        hidden = len(ids) - len(shown)
        if not hidden:
            return m.group(0)
        lead = "replicas of " if m.group("lead") == "replicas of" else ""
        others = OTHER_TEAM if hidden == 1 else f"{hidden} jobs of other teams"
        if not shown:
            return lead + others
        named = f"job {shown[0]}" if len(shown) == 1 else f"jobs {', '.join(shown)}"
        return f"{lead}{named} and {others}"

    return _MENTION.sub(mention, text)


def _ids(m: re.Match[str]) -> list[str]:
    return m.group("ids").split(", ")


ANOTHER_TENANT = "another team"


def hidden_tenants(user: Any) -> re.Pattern[str] | None:
    """A pattern of the tenant slugs `user` may not name: neither in their subtrees nor above
    them (a member knows their department). A reclaim reads "team-a reclaims its guarantee
    from team-b": team-b's members learn only that another team reclaimed. None: all known."""
    grants = access.grants_for(user)
    if grants.sees_everything:
        return None
    known: set[int] = set()
    for tenant in access.tenants_visible(user).only("id", "path"):
        known.update(tenant.ancestor_ids())
    return _slugs_except(known)


def text_for_members(text: str, tenant: Tenant) -> str:
    """`text` as any member of `tenant` may read it in the portal: the ids of jobs outside
    its subtree become "a job of another team", the slugs of tenants neither above nor below
    it "another team". For messages that leave the portal (a job's notifications go to its
    owner and to its tenant's webhook, whose readers are the tenant's members): a query
    for the jobs it names, if any, and two for the tenants."""
    ids = mentioned_ids([text])
    if ids:
        inside = Job.objects.filter(pk__in=ids, tenant__path__startswith=tenant.path)
        text = redact(text, set(inside.values_list("pk", flat=True)))
    below = Tenant.objects.filter(path__startswith=tenant.path).values_list("pk", flat=True)
    hidden = _slugs_except({*tenant.ancestor_ids(), *below})
    return hidden.sub(ANOTHER_TENANT, text) if hidden is not None else text


def _slugs_except(known: set[int]) -> re.Pattern[str] | None:
    hidden = list(Tenant.objects.exclude(pk__in=known).values_list("slug", flat=True))
    if not hidden:
        return None
    names = "|".join(re.escape(s) for s in sorted(hidden, key=len, reverse=True))
    return re.compile(rf"(?<![\w-])(?:{names})(?![\w-])")


class ReasonReader:
    """Rewrites the texts of one page for ``user``, with one query for all their ids (and
    two for the tenants they may not name, when a text names a tenant at all)."""

    def __init__(self, user: Any, texts: Iterable[str]) -> None:
        texts = list(texts)
        ids = mentioned_ids(texts)
        self.visible = job_ids_visible(user, ids) if ids and user is not None else set()
        self.tenants = (
            hidden_tenants(user)
            if user is not None and any(_NAMES_TENANT.search(t or "") for t in texts)
            else None
        )

    def text(self, text: str) -> str:
        if not text:
            return text
        text = redact(text, self.visible)
        return self.tenants.sub(ANOTHER_TENANT, text) if self.tenants is not None else text

    def data(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """An event's data without the id of a preemptor the viewer may not see."""
        out = dict(data)
        preemptor = out.get("preemptor")
        if preemptor is not None and not (
            str(preemptor).isdigit() and int(preemptor) in self.visible
        ):
            out.pop("preemptor")
        return out

    @staticmethod
    def texts_of(jobs: Iterable[Any], events: Iterable[Any] = ()) -> list[str]:
        out = [job.reason for job in jobs]
        for event in events:
            out.append(event.message)
            preemptor = (event.data or {}).get("preemptor")
            if preemptor is not None:
                out.append(f"job {preemptor}")
        return out
