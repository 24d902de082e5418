"""The node agent: NVML readings through a fake `pynvml`, the report, the command."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from scheduler.agent import nvml as nvml_module
from scheduler.agent.nvml import NvmlSession
from scheduler.agent.report import build_report, report_url

MIB = 1024 * 1024


class NVMLError(Exception):
    pass


class FakeNvml:
    """The slice of pynvml the agent uses: two H100s, device 1 with uncorrected ECC errors."""

    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8
    NVMLError = NVMLError

    def __init__(
        self,
        ecc: tuple[int | None, ...] = (0, 2),
        xids: tuple[tuple[int, int], ...] = (),
        lost: int | None = None,
    ):
        self.ecc = ecc
        self.lost = lost
        self.pending = list(xids)  # (device index, xid)
        self.shut_down = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index == self.lost:
            raise NVMLError("GPU is lost")
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle:04d}"

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=81559 * MIB, used=(1024 + handle * 40000) * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=[97, 3][handle], memory=50)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 61 + handle

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        value = self.ecc[handle]
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, events: str) -> None: ...
    def nvmlEventSetFree(self, events: str) -> None: ...

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.pending:
            raise NVMLError("Timeout")
        index, xid = self.pending.pop(0)
        return SimpleNamespace(device=index, eventData=xid)


class NVMLError_NotSupported(NVMLError):
    pass


class GpmNvml(FakeNvml):
    """The fake with NVML's GPM, as pynvml spells it: per device whether GPM is supported
    (`gpm`), the SM_UTIL it reports over each interval (`sm_util`, in turn), and on command
    a GPM call that raises (`fail`: {(call, device index): the error}). It counts samples
    allocated and freed, as the driver would hold them."""

    NVML_SUCCESS = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_SM_UTIL = 2
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(
        self,
        gpm: tuple[bool, ...] = (True, True),
        sm_util: tuple[float, ...] = (55.5, 12.25),
        **kw: Any,
    ):
        super().__init__(ecc=(0, 0), **kw)
        self.gpm = gpm
        self.sm_util = list(sm_util)
        self.fail: dict[tuple[str, int], Exception] = {}
        self.live: set[int] = set()  # samples allocated, not freed
        self.allocated = 0
        self.device_of: dict[int, int] = {}

    def _maybe_fail(self, call: str, index: int) -> None:
        error = self.fail.pop((call, index), None)
        if error is not None:
            raise error

    def nvmlGpmQueryDeviceSupport(self, handle: int) -> Any:
        self._maybe_fail("support", handle)
        return SimpleNamespace(version=1, isSupportedDevice=int(self.gpm[handle]))

    def nvmlGpmSampleAlloc(self) -> int:
        self.allocated += 1
        self.live.add(self.allocated)
        return self.allocated

    def nvmlGpmSampleFree(self, sample: int) -> None:
        self.live.remove(sample)  # a double free raises, as the driver's would corrupt

    def nvmlGpmSampleGet(self, handle: int, sample: int) -> int:
        assert self.gpm[handle], "GPM sample of a device without GPM"
        self._maybe_fail("sample", handle)
        self.device_of[sample] = handle
        return sample

    class c_nvmlGpmMetricsGet_t:
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(4)]

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        handle = self.device_of[request.sample2]
        assert self.device_of[request.sample1] == handle and request.sample1 < request.sample2
        assert request.version == 1 and request.numMetrics == 1
        self._maybe_fail("metrics", handle)
        metric = request.metrics[0]
        assert metric.metricId == self.NVML_GPM_METRIC_SM_UTIL  # DCGM's SM_ACTIVE
        metric.value = self.sm_util[handle]
        return request


class NoDriver:
    NVMLError = NVMLError

    def nvmlInit(self) -> None:
        raise NVMLError("NVML Shared Library Not Found")


def test_two_gpus_one_with_ecc_errors_is_unhealthy() -> None:
    session = NvmlSession(FakeNvml())  # type: ignore[arg-type]
    reading = session.read()
    assert reading.driver_version == "550.54.15" and reading.error == ""
    first, second = reading.gpus
    assert (first.uuid, first.name, first.memory_total_mib, first.memory_used_mib) == (
        "GPU-0000", "NVIDIA H100 80GB HBM3", 81559, 1024)  # fmt: skip
    assert (first.utilization_pct, first.temperature_c, first.ecc_uncorrected) == (97, 61, 0)
    assert first.healthy
    assert second.ecc_uncorrected == 2 and not second.healthy


@pytest.mark.parametrize(
    ("xid", "healthy"), [(13, True), (43, True), (48, False), (79, False), (94, True), (95, False)]
)
def test_xid_events_since_the_last_report(xid: int, healthy: bool) -> None:
    session = NvmlSession(FakeNvml(ecc=(0, 0), xids=((0, xid),)))  # type: ignore[arg-type]
    first, second = session.read().gpus
    assert first.xid_errors == (xid,) and first.healthy is healthy
    assert second.xid_errors == () and second.healthy
    assert session.read().gpus[0].xid_errors == ()  # drained: reported once


def test_a_lost_device_is_reported_unhealthy_not_dropped() -> None:
    session = NvmlSession(FakeNvml(ecc=(0, 0), lost=1))  # type: ignore[arg-type]
    first, second = session.read().gpus
    assert first.healthy and first.uuid == "GPU-0000"
    assert second.lost and not second.healthy and second.index == 1


def test_field_not_supported_is_none_not_a_lost_device() -> None:
    session = NvmlSession(FakeNvml(ecc=(None, 0)))  # type: ignore[arg-type]
    first, _ = session.read().gpus
    assert first.ecc_uncorrected is None and first.healthy and first.memory_total_mib == 81559


def test_without_nvml_no_gpus_and_the_reason() -> None:
    session = NvmlSession(NoDriver())  # type: ignore[arg-type]
    reading = session.read()
    assert not session.available and reading.gpus == ()
    assert "NVML Shared Library Not Found" in reading.error
    session.close()


def test_report_shape() -> None:
    report = build_report("gpu-1", NvmlSession(FakeNvml()).read())  # type: ignore[arg-type]
    assert report["node"] == "gpu-1" and report["driver_version"] == "550.54.15"
    assert set(report["gpus"][0]) == {
        "index", "uuid", "name", "memory_total_mib", "memory_used_mib", "utilization_pct",
        "temperature_c", "ecc_uncorrected", "xid_errors", "healthy", "power_w", "sm_active_pct",
    }  # fmt: skip
    assert [g["healthy"] for g in report["gpus"]] == [True, False]
    # The fake NVML has no power reading and no GPM: sent as null, not 0 (a sample of 0 W).
    assert (report["gpus"][0]["power_w"], report["gpus"][0]["sm_active_pct"]) == (None, None)


def test_power_is_read_in_watts() -> None:
    class WithPower(FakeNvml):
        def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
            return 412_500  # NVML reports milliwatts

    report = build_report("gpu-1", NvmlSession(WithPower()).read())  # type: ignore[arg-type]
    assert report["gpus"][0]["power_w"] == 412.5


def test_report_is_accepted_by_the_endpoint_serializer() -> None:
    """The daemon side's validator (scheduler/api/nodes.py) takes what the agent sends, also
    for a lost device and fields NVML cannot read."""
    from scheduler.api.nodes import GpuReportIn

    for nvml in (FakeNvml(), FakeNvml(ecc=(None, 0), lost=1), FakeNvml(xids=((0, 79),) * 100)):
        report = build_report("gpu-1", NvmlSession(nvml).read())  # type: ignore[arg-type]
        body = GpuReportIn(data=report)
        assert body.is_valid(), body.errors
    assert report["gpus"][0]["xid_errors"] == [79] and not report["gpus"][0]["healthy"]


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://gantry:8000", "http://gantry:8000/api/v1/nodes/report/"),
        ("https://g.example/", "https://g.example/api/v1/nodes/report/"),
        ("https://g.example/api/v1/nodes/report/", "https://g.example/api/v1/nodes/report/"),
    ],
)
def test_report_url(base: str, url: str) -> None:
    assert report_url(base) == url


@pytest.mark.parametrize("bad", ["file:///etc/passwd", "gantry:8000", "ftp://x/"])
def test_report_url_refuses_other_schemes(bad: str) -> None:
    with pytest.raises(ValueError):
        report_url(bad)


# -- the command ------------------------------------------------------------------------------


class Receiver:
    """A local endpoint that records what the agent posts."""

    def __init__(self, status: int = 200) -> None:
        self.posts: list[tuple[str, dict[str, str], Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.posts.append((self.path, dict(self.headers), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def test_command_posts_the_report_with_the_token(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml_module, "load_pynvml", FakeNvml)
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    call_command("run_node_agent", "--once", "--url", receiver.url, "--token", "s3cret",
                 "--node", "gpu-7", stdout=StringIO())  # fmt: skip
    ((path, headers, body),) = receiver.posts
    assert path == "/api/v1/nodes/report/"
    assert headers["Authorization"] == "Token s3cret"
    assert body["node"] == "gpu-7" and [g["healthy"] for g in body["gpus"]] == [True, False]


def test_command_without_nvml_degrades_cleanly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(nvml_module, "load_pynvml", NoDriver)
    out = StringIO()
    with caplog.at_level(logging.WARNING, logger="scheduler.agent"):
        call_command("run_node_agent", "--once", "--print", "--node", "cpu-1", stdout=out)
    assert json.loads(out.getvalue()) == {"node": "cpu-1", "driver_version": "", "gpus": []}
    (line,) = [r.getMessage() for r in caplog.records if "NVML" in r.getMessage()]
    assert line.startswith("NVML unavailable: ") and line.endswith("; reporting no GPUs")


def test_command_once_fails_when_the_report_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_module, "load_pynvml", NoDriver)
    refusing = Receiver(status=403)
    try:
        with pytest.raises(CommandError):
            call_command("run_node_agent", "--once", "--url", refusing.url, "--token", "bad",
                         stdout=StringIO())  # fmt: skip
    finally:
        refusing.close()
    assert len(refusing.posts) == 1


def test_command_needs_a_token_with_a_url() -> None:
    with pytest.raises(CommandError, match="--token"):
        call_command("run_node_agent", "--once", "--url", "http://x", "--token", "")


def test_command_reads_its_nodes_token_from_a_file_at_every_report(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The DaemonSet gives each agent the file of its own node's token (issue 17, point 5);
    a rotated token is read at the next report."""
    monkeypatch.setattr(nvml_module, "load_pynvml", NoDriver)
    token_file = tmp_path / "gpu-7"
    for token in ("first", "rotated"):
        token_file.write_text(f"{token}\n")
        call_command("run_node_agent", "--once", "--url", receiver.url, "--token-file",
                     str(token_file), "--node", "gpu-7", stdout=StringIO())  # fmt: skip
    assert [headers["Authorization"] for _, headers, _ in receiver.posts] == [
        "Token first",
        "Token rotated",
    ]


def test_command_sends_the_pods_service_account_token_as_bearer_at_every_report(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """On Kubernetes the DaemonSet mounts the pod's projected token (issue 34, item 6), which
    the kubelet rotates: read at every report, sent as Bearer for the web's TokenReview."""
    monkeypatch.setattr(nvml_module, "load_pynvml", NoDriver)
    token_file = tmp_path / "token"
    for token in ("eyJ.first.sig", "eyJ.rotated.sig"):
        token_file.write_text(token)
        call_command("run_node_agent", "--once", "--url", receiver.url,
                     "--service-account-token-file", str(token_file), "--node", "gpu-7",
                     stdout=StringIO())  # fmt: skip
    assert [headers["Authorization"] for _, headers, _ in receiver.posts] == [
        "Bearer eyJ.first.sig",
        "Bearer eyJ.rotated.sig",
    ]


def test_command_refuses_a_missing_token_file(tmp_path: Any) -> None:
    with pytest.raises(CommandError, match="cannot read the token file"):
        call_command("run_node_agent", "--once", "--url", "http://x",
                     "--token-file", str(tmp_path / "absent"))  # fmt: skip


def test_gpm_sm_activity_over_the_interval_between_two_reports() -> None:
    nvml = GpmNvml()
    session = NvmlSession(nvml)  # type: ignore[arg-type]
    first = session.read().gpus
    assert [g.sm_active_pct for g in first] == [None, None]  # one sample: no interval yet
    second = session.read().gpus
    assert [g.sm_active_pct for g in second] == [55.5, 12.2]
    assert [g.sm_active_pct for g in session.read().gpus] == [55.5, 12.2]
    assert len(nvml.live) == 2  # each device keeps its latest sample, the older ones freed
    session.close()
    assert nvml.live == set()


def test_without_gpm_in_the_bindings_no_sm_activity() -> None:
    """An older nvidia-ml-py without the GPM functions: every other field as before."""
    session = NvmlSession(FakeNvml(ecc=(0, 0)))  # type: ignore[arg-type]
    for _ in range(2):
        first, second = session.read().gpus
        assert (first.sm_active_pct, second.sm_active_pct) == (None, None)
        assert first.utilization_pct == 97 and first.healthy


@pytest.mark.parametrize(
    "unsupported",
    [
        pytest.param(lambda nvml: GpmNvml(gpm=(True, False)), id="isSupportedDevice-0"),
        pytest.param(None, id="query-raises-NotSupported"),
    ],
)
def test_gpm_not_supported_on_one_device_of_two(unsupported: Any) -> None:
    if unsupported is None:
        nvml = GpmNvml()
        nvml.fail[("support", 1)] = NVMLError_NotSupported("Not Supported")
    else:
        nvml = unsupported(None)
    session = NvmlSession(nvml)  # type: ignore[arg-type]
    session.read()
    first, second = session.read().gpus
    assert (first.sm_active_pct, second.sm_active_pct) == (55.5, None)
    assert second.utilization_pct == 3 and second.healthy  # the rest of the device as before
    assert set(nvml.device_of.values()) == {0}  # never sampled where unsupported
    session.close()
    assert nvml.live == set()


@pytest.mark.parametrize("call", ["sample", "metrics"])
def test_a_gpm_call_failing_mid_way_gives_none_and_leaks_no_sample(call: str) -> None:
    nvml = GpmNvml()
    session = NvmlSession(nvml)  # type: ignore[arg-type]
    session.read()
    nvml.fail[(call, 0)] = NVMLError("Unknown Error")
    first, second = session.read().gpus
    assert (first.sm_active_pct, second.sm_active_pct) == (None, 12.2)
    assert first.utilization_pct == 97 and not first.lost
    assert len(nvml.live) == 1  # device 0's samples freed, device 1's latest kept
    session.read()  # device 0 starts a new interval: a passing error does not stop GPM
    assert [g.sm_active_pct for g in session.read().gpus] == [55.5, 12.2]
    nvml.fail[(call, 0)] = NVMLError_NotSupported("Not Supported")
    assert [g.sm_active_pct for g in session.read().gpus] == [None, 12.2]
    assert [g.sm_active_pct for g in session.read().gpus] == [None, 12.2]  # not asked again
    session.close()
    assert nvml.live == set()
