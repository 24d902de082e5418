"""FederatedBackend: the daemon's pool holds the members' `max_in_flight` summed, but a member
that takes concurrent writes is never sent more than its own at once, even when a cycle's
writes all go to it (a Kubernetes member's connection pool is sized for its own)."""

from __future__ import annotations

import threading
from typing import Any

from scheduler.backends.base import PodRequest
from scheduler.backends.federated import Member, federate
from tests.clusters.test_federated import _Plain, pod


class _Held(_Plain):
    """A member whose creates wait until released, counting how many are inside at once."""

    max_in_flight = 2
    creates_bound = True

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.peak = 0
        self.changed = threading.Condition()
        self.release = threading.Event()

    def create_pod(self, pod: PodRequest) -> None:
        with self.changed:
            self.inside.append(pod.name)
            self.peak = max(self.peak, len(self.inside))
            self.changed.notify_all()
        self.release.wait(10)
        with self.changed:
            self.inside.remove(pod.name)


def test_a_member_gets_at_most_its_own_writes_in_flight() -> None:
    busy, idle = _Held(), _Held()
    fed: Any = federate([Member("a", busy), Member("b", idle)])
    assert fed.max_in_flight == 4  # the daemon may send 4 at once, all of them to `a`
    threads = [
        threading.Thread(target=fed.create_pod, args=(pod(f"p{i}", "a:n-0", job_id=i),))
        for i in range(6)
    ]
    for thread in threads:
        thread.start()
    with busy.changed:
        assert busy.changed.wait_for(lambda: len(busy.inside) == 2, timeout=10)
        # the other four wait for a slot (without the bound all six would be inside by now)
        assert not busy.changed.wait_for(lambda: len(busy.inside) > 2, timeout=0.5)
    busy.release.set()
    for thread in threads:
        thread.join(timeout=10)
    assert busy.peak == 2 and idle.peak == 0
