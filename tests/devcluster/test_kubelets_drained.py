"""Kubelets read every answer before giving its connection back to the pool.

A raw answer (`_preload_content=False`) handed back unread leaves its body on the connection,
and the next request on it reads those bytes as its status line: registering 75 nodes against
the real API server failed with `BadStatusLine` part-way (a node's JSON where `HTTP/1.1 200`
belonged)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from devcluster import kubelets as kubelets_module
from devcluster.kubelets import Kubelets, NodeShape


class Answer:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.read = False

    @property
    def data(self) -> bytes:
        self.read = True
        return b"{}"

    def release_conn(self) -> None:
        self.log.append("read" if self.read else "unread")


class Api:
    """Every method answers with an Answer that records whether it was read when released."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: Answer(self.log)


def test_kubelets_read_each_answer_before_releasing_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The heartbeats do not go through the typed client (tests/devcluster/test_heartbeats.py).
    monkeypatch.setattr(kubelets_module, "heartbeat_round", lambda *args: [])
    kubelets = Kubelets(client.ApiClient())
    api = Api()
    kubelets.core = kubelets.coordination = api
    kubelets.add_nodes(["gpu-1", "gpu-2"], NodeShape(gpus=8))
    kubelets.lose_node("gpu-2")
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "image": "x"}]},
    }
    kubelets._start(pod)
    kubelets._end(pod, "Succeeded", 0)
    kubelets._finish_deletion(pod)
    assert len(api.log) >= 8
    assert api.log == ["read"] * len(api.log)
