"""The node agent's /metrics under dcgm-exporter's names and labels, with the pod and
namespace of the job holding each device (scheduler/agent/exporter.py, issue 20)."""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from scheduler.agent.exporter import DcgmExporter, Holder, holders_from, serve
from scheduler.agent.nvml import NodeReading, NvmlSession
from scheduler.management.commands.run_node_agent import Command
from scheduler.models import AllocationDevice, GpuDevice, JobState
from tests import factories as f
from tests.conftest import Org
from tests.k8s.test_agent import FakeNvml, GpmNvml

DCGM = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_XID_ERRORS",
}
LABELS = {"gpu", "UUID", "device", "modelName", "Hostname", "pod", "namespace"}


class PoweredNvml(FakeNvml):
    """The fake of tests/k8s/test_agent.py with power readings (350 W, 120 W)."""

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return [350_000, 120_000][handle]  # milliwatts


def exported(exporter: DcgmExporter) -> dict[str, dict[str, tuple[dict[str, str], float]]]:
    """name -> gpu index -> (labels, value), read back with prometheus_client's parser."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    out: dict[str, dict[str, tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[sample.labels["gpu"]] = (sample.labels, sample.value)
    return out


def reading(nvml: Any = None) -> NodeReading:
    return NvmlSession(nvml or PoweredNvml(ecc=(0, 0))).read()


def test_dcgm_names_units_and_labels_over_fake_nvml() -> None:
    exporter = DcgmExporter("gpu-node-7")
    exporter.update(reading())
    exporter.set_holders({0: Holder("gantry-12-a0-r0", "ml-alpha")})
    series = exported(exporter)
    assert set(series) >= DCGM
    labels, util = series["DCGM_FI_DEV_GPU_UTIL"]["0"]
    assert set(labels) == LABELS
    assert labels == {"gpu": "0", "UUID": "GPU-0000", "device": "nvidia0",
                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-7",
                      "pod": "gantry-12-a0-r0", "namespace": "ml-alpha"}  # fmt: skip
    assert util == 97
    # The fake's device 1: 81559 MiB, of which 1024 + 40000 used; 120 W; 62 C; nobody holds it.
    assert series["DCGM_FI_DEV_FB_USED"]["1"][1] == 41024
    assert series["DCGM_FI_DEV_FB_FREE"]["1"][1] == 81559 - 41024
    assert series["DCGM_FI_DEV_POWER_USAGE"]["1"][1] == 120
    assert series["DCGM_FI_DEV_GPU_TEMP"]["1"][1] == 62
    assert series["DCGM_FI_DEV_XID_ERRORS"]["1"][1] == 0
    assert (series["DCGM_FI_DEV_GPU_UTIL"]["1"][0]["pod"],
            series["DCGM_FI_DEV_GPU_UTIL"]["1"][0]["namespace"]) == ("", "")  # fmt: skip


def test_sm_active_only_where_gpm_gives_it() -> None:
    """DCGM_FI_PROF_SM_ACTIVE is a ratio; a device without GPM has no such series (not 0)."""
    exporter = DcgmExporter("n")
    first, second = reading().gpus
    exporter.update(NodeReading("550", (replace(first, sm_active_pct=42.0), second)))
    series = exported(exporter)
    assert series["DCGM_FI_PROF_SM_ACTIVE"] == {
        "0": (series["DCGM_FI_PROF_SM_ACTIVE"]["0"][0], pytest.approx(0.42))
    }
    exporter.update(reading())  # no GPM anywhere
    assert "DCGM_FI_PROF_SM_ACTIVE" not in exported(exporter)


def test_sm_active_from_the_agents_gpm_reading() -> None:
    """Through NVML's GPM (the fake's SM_UTIL 55.5 % on device 0; device 1 without GPM): the
    agent's second reading carries it, and the exporter serves it as a ratio for device 0
    only."""
    session = NvmlSession(GpmNvml(gpm=(True, False)))  # type: ignore[arg-type]
    exporter = DcgmExporter("n")
    exporter.update(session.read())
    assert "DCGM_FI_PROF_SM_ACTIVE" not in exported(exporter)  # no interval yet
    exporter.update(session.read())
    active = exported(exporter)["DCGM_FI_PROF_SM_ACTIVE"]
    assert {gpu: value for gpu, (_, value) in active.items()} == {"0": pytest.approx(0.555)}
    session.close()


def test_last_xid_is_kept_and_unread_fields_are_left_out() -> None:
    exporter = DcgmExporter("n")
    exporter.update(reading(PoweredNvml(ecc=(0, 0), xids=((1, 13), (1, 79)))))
    exporter.update(reading(PoweredNvml(ecc=(0, 0))))  # no new XID: the last one stays
    series = exported(exporter)
    assert series["DCGM_FI_DEV_XID_ERRORS"]["1"][1] == 79
    # Without power readings (the plain fake), no power series rather than a false 0 W.
    exporter.update(reading(FakeNvml(ecc=(0, 0), lost=1)))
    series = exported(exporter)
    assert "DCGM_FI_DEV_POWER_USAGE" not in series
    assert set(series["DCGM_FI_DEV_GPU_UTIL"]) == {"0"}  # the lost device has no series


def share(index: int, pod: str, milli: int) -> dict[str, Any]:
    return {"index": index, "pod": pod, "namespace": "ns", "milli": milli}


@pytest.mark.parametrize(
    ("answer", "holders"),
    [
        pytest.param({"holders": []}, {}, id="nobody"),
        pytest.param(
            {"holders": [share(1, "b", 400), share(1, "a", 600)]},
            {1: Holder("a", "ns")},
            id="largest-share",
        ),
        pytest.param(
            {"holders": [share(0, "z", 500), share(0, "y", 500)]},
            {0: Holder("y", "ns")},
            id="tie-first-name",
        ),
        pytest.param({"holders": [{"index": "0", "pod": 3}]}, {}, id="malformed"),
        pytest.param(None, {}, id="no-body"),
    ],
)
def test_holders_from_the_report_answer(answer: Any, holders: dict[int, Holder]) -> None:
    assert holders_from(answer) == holders


def test_the_report_answer_names_each_devices_holder(org: Org) -> None:
    """Through the real endpoint: the agent's report is answered with who holds its node's
    devices now, which become the exported pod and namespace labels."""
    node = f.NodeFactory(name="gpu-node-9")
    devices = [
        GpuDevice.objects.create(node=node, index=i, uuid=f"GPU-{i}", memory_mib=81920)
        for i in range(3)
    ]
    whole = f.JobFactory(project=org.proj_alpha, state=JobState.RUNNING)
    (allocation,) = f.place(whole, node)
    AllocationDevice.objects.create(allocation=allocation, device=devices[0], milli=1000)
    pods = {}
    for milli in (400, 600):  # two fractional jobs share device 1
        shared = f.JobFactory(project=org.proj_bravo, state=JobState.RUNNING,
                              gpus_per_replica=0, gpu_milli_per_replica=milli)  # fmt: skip
        (part,) = f.place(shared, node)
        AllocationDevice.objects.create(allocation=part, device=devices[1], milli=milli)
        pods[milli] = part.pod_name
    out = StringIO()
    call_command("node_agent_token", "gpu-node-9", stdout=out)
    client = Client(headers={"Authorization": f"Token {out.getvalue().strip()}"})
    report = {"node": "gpu-node-9", "driver_version": "550", "gpus": [
        {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3",
         "memory_total_mib": 81559, "memory_used_mib": 1024, "utilization_pct": 50.0,
         "temperature_c": 60.0, "ecc_uncorrected": 0, "xid_errors": [], "healthy": True}
        for i in range(3)]}  # fmt: skip
    response = client.post("/api/v1/nodes/report/", report, content_type="application/json")
    assert response.status_code == 200, response.json()
    assert holders_from(response.json()) == {  # device 2: nobody
        0: Holder(allocation.pod_name, org.proj_alpha.namespace),
        1: Holder(pods[600], org.proj_bravo.namespace),  # the larger share
    }


class Gantry:
    """A stand-in for Gantry's report endpoint that answers with holders."""

    def __init__(self, answer: dict[str, Any]) -> None:
        payload = json.dumps(answer).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_agent_serves_what_it_read_labelled_with_gantrys_answer() -> None:
    """One report of the command's loop, then a scrape of the agent's port."""
    gantry = Gantry({"holders": [{"index": 1, "pod": "gantry-5-a0-r1", "namespace": "ml",
                                  "milli": 1000}]})  # fmt: skip
    exporter = DcgmExporter("gpu-node-3")
    server = serve(exporter, 0, addr="127.0.0.1")
    session = NvmlSession(PoweredNvml(ecc=(0, 0)))  # type: ignore[arg-type]
    try:
        options = {"node": "gpu-node-3", "url": gantry.url, "token": "t", "token_file": "",
                   "print": False}  # fmt: skip
        assert Command()._report_once(session, exporter, options)
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        gantry.close()
    util = {
        s.labels["gpu"]: s.labels
        for family in text_string_to_metric_families(text)
        if family.name == "DCGM_FI_DEV_GPU_UTIL"
        for s in family.samples
    }
    assert util["1"]["pod"] == "gantry-5-a0-r1" and util["1"]["namespace"] == "ml"
    assert util["0"]["pod"] == "" and util["0"]["Hostname"] == "gpu-node-3"
