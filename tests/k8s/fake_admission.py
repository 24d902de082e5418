"""The fake API server's call to Gantry's mutating admission webhook (issue 37), as the real
API server makes it with `platform/k8s/24-webhook.yaml`'s configuration:

- only for a CREATE in a namespace labelled `app.kubernetes.io/managed-by: gantry` (its
  namespaceSelector), of the kinds its rules name;
- an AdmissionReview naming the authenticated user (`user`: the fake authenticates nobody,
  so the test says who creates), answered by the webhook's own pure function
  (`scheduler.workloads.mutate.review_response`) and its JSONPatch applied;
- `failurePolicy: Fail`: while the webhook is down (`down`), or when it fails, the create is
  refused with the API server's 500 InternalError, and nothing is stored.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass

import jsonpatch

from scheduler.workloads.mutate import review_response
from tests.k8s.fake_rules import ApiError, Obj

# resource -> (group, version, kind) of the kinds the webhook's rules name that the fake serves.
KINDS = {
    "pods": ("", "v1", "Pod"),
    "jobs": ("batch", "v1", "Job"),
}
SERVICE = "https://gantry-webhook.gantry-system.svc:443/mutate?timeout=5s"


@dataclass
class FakeWebhook:
    user: str = "alice"
    down: bool = False
    exempt: tuple[str, ...] = ()
    calls: int = 0

    def admit(self, resource: str, namespace: Obj | None, body: Obj) -> None:
        """Mutate `body` in place as the webhook answers, or raise the API server's refusal."""
        labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
        if resource not in KINDS or labels.get("app.kubernetes.io/managed-by") != "gantry":
            return
        if self.down:
            raise ApiError(
                500,
                "InternalError",
                'Internal error occurred: failed calling webhook "workloads.gantry.io": failed '
                f'to call webhook: Post "{SERVICE}": dial tcp 10.96.0.42:443: connect: '
                "connection refused",
            )
        self.calls += 1
        group, version, kind = KINDS[resource]
        request = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "namespace": namespace["metadata"]["name"] if namespace else "",
            "operation": "CREATE",
            "userInfo": {"username": self.user, "groups": ["system:authenticated"]},
            "object": body,
        }
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
        answer = review_response({**review, "request": request}, exempt_users=self.exempt)
        response = answer["response"]
        if "patch" in response:
            ops = json.loads(base64.b64decode(response["patch"]))
            jsonpatch.apply_patch(body, ops, in_place=True)
