"""What a kubelet sends to say its node lives, for thousands of simulated nodes in one round.

Every 10 s a kubelet renews its node's Lease in kube-node-lease; every 5 minutes it reports its
node status again even when nothing changed (nodeStatusReportFrequency). The node lifecycle
controller takes either as a sign of life, and marks NotReady (then taints) a node with
neither within its grace period. A round here renews every node's Lease (creating the missing
ones, as a kubelet does at start) and reports the status of one node in STATUS_ROUNDS, each in
its turn, so that the status reports spread evenly over the rounds instead of all falling due
together; a node the controller marked not Ready reports at once, as a kubelet that sees the
server's status differ from its own. The requests go out concurrently through devcluster.fanout.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterable

from devcluster.fanout import MERGE_PATCH, STRATEGIC_PATCH, Answer, Fanout, Request

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40  # a kubelet's leaseDurationSeconds
RENEW_EVERY_S = 10.0  # a kubelet renews its lease every quarter of that
# At a round every 10 s, each node's turn to report its status comes every 30th round: 5 min.
STATUS_ROUNDS = 30

Failure = tuple[str, Answer]  # the node, and the answer that failed it


def heartbeat_round(
    fanout: Fanout, names: list[str], round_number: int, not_ready: Iterable[str] = ()
) -> list[Failure]:
    """Renew the nodes' leases and report the status of those whose turn it is, and at once
    of those `not_ready` (marked so by the node lifecycle controller, while the kubelet
    thinks its node Ready); the nodes whose request failed (the others were renewed)."""
    failed = renew_leases(fanout, names)
    turn = round_number % STATUS_ROUNDS
    marked = set(not_ready)
    due = [
        name
        for name in names
        if name in marked or zlib.crc32(name.encode()) % STATUS_ROUNDS == turn
    ]
    answers = fanout.send([_status_report(name) for name in due])
    return failed + [(name, a) for name, a in zip(due, answers, strict=True) if not ok(a)]


def ok(answer: Answer) -> bool:
    return 200 <= answer.status < 300


def renew_leases(fanout: Fanout, names: list[str]) -> list[Failure]:
    renewals = [lease_renewal(name) for name in names]
    answers = fanout.send(renewals)
    failed = [(n, a) for n, a in zip(names, answers, strict=True) if not ok(a) and a.status != 404]
    missing = [n for n, a in zip(names, answers, strict=True) if a.status == 404]
    if missing:  # a new node, or its lease deleted: created, as the kubelet would
        created = fanout.send([_lease_creation(name) for name in missing])
        # Created meanwhile by another round (a node's registration beats its new nodes while
        # the periodic round beats every node): renewed, as the kubelet does when its create
        # finds the lease there.
        raced = []
        for name, answer in zip(missing, created, strict=True):
            if answer.status == 409:
                raced.append(name)
            elif not ok(answer):
                failed.append((name, answer))
        if raced:
            answers = fanout.send([lease_renewal(name) for name in raced])
            failed += [(n, a) for n, a in zip(raced, answers, strict=True) if not ok(a)]
    return failed


def _lease_spec(name: str) -> dict[str, object]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": now}


def lease_renewal(name: str) -> Request:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"
    return Request("PATCH", path, {"spec": _lease_spec(name)}, MERGE_PATCH)


def _lease_creation(name: str) -> Request:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
    body = {"metadata": {"name": name, "namespace": LEASE_NAMESPACE}, "spec": _lease_spec(name)}
    return Request("POST", path, body)


def _status_report(name: str) -> Request:
    """The Ready condition again; its lastTransitionTime stays as it was (the patch merges the
    conditions by type)."""
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "devcluster plays this kubelet",
        "lastHeartbeatTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    body = {"status": {"conditions": [ready]}}
    return Request("PATCH", f"/api/v1/nodes/{name}/status", body, STRATEGIC_PATCH)
