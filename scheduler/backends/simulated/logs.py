"""The simulated cluster's pod logs: believable lines, made up from the job alone.

A pod's log is a pure function of (job id, attempt, replica), its job type, when it started,
when and how it ended, and the time asked about, so the web and API processes read the same
lines as the daemon would, without its in-memory cluster. Line `i` is computed on its own
(its noise is seeded by the pod and `i`), so a tail of a pod that has run for weeks costs no
more than a tail of a new one.

A log is a prologue (what the image prints as it starts), a body of one line every
`every_s` seconds while it runs (training: step, falling loss, throughput, a checkpoint save
every so often; inference: requests served; interactive: a notebook server's lines), and,
once the pod has ended, an epilogue that says how: a traceback for a failed attempt, CUDA's
out-of-memory error for an OOM, a checkpoint on SIGTERM for a preempted one.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from scheduler.backends.base import LogLine, LogPage, LogTarget

# The most lines one read returns; a cursor continues from the last of them.
PAGE_LINES = 1000


def _unit(target: LogTarget, *parts: object) -> float:
    """A number in [0, 1) fixed by the pod and `parts`: the logs' only randomness."""
    key = f"{target.job_id}:{target.attempt}:{target.replica}:" + ":".join(map(str, parts))
    return zlib.crc32(key.encode()) / 2**32


@dataclass(frozen=True)
class _Script:
    """How a job type's log reads: fixed opening lines (at their second after the start), then
    a body line every `every_s` seconds written by `body(target, i)`."""

    prologue: tuple[tuple[float, str], ...]
    every_s: float
    body: Callable[[LogTarget, int], str]


def _training_line(target: LogTarget, i: int) -> str:
    step = (i + 1) * 50
    if (i + 1) % 20 == 0:
        where = f"/ckpt/step-{step:07d}"
        return f"[rank{target.replica}] saved checkpoint {where} (attempt {target.attempt})"
    start = 2.2 + 1.4 * _unit(target, "loss0")
    floor = 0.35 + 0.3 * _unit(target, "floor")
    loss = floor + (start - floor) * math.exp(-step / 4000) + 0.04 * (_unit(target, i) - 0.5)
    rate = 900 + 700 * _unit(target, "rate")
    samples = rate * (1 + 0.06 * (_unit(target, "tp", i) - 0.5))
    return (
        f"[rank{target.replica}] step {step} | loss {loss:.4f} | lr 3.0e-04 | "
        f"{samples:.0f} samples/s"
    )


def _batch_line(target: LogTarget, i: int) -> str:
    done = (i + 1) * (400 + int(600 * _unit(target, "batch")))
    return f"processed {done} examples ({done / (15 * (i + 1)):.1f} examples/s)"


def _inference_line(target: LogTarget, i: int) -> str:
    # Load follows the time of day the line stands for, as inference traffic does.
    hour = ((target.started_at.hour * 60 + target.started_at.minute) / 60 + (i + 1) / 60) % 24
    load = 0.55 + 0.45 * math.sin((hour - 9) / 24 * 2 * math.pi)
    served = int((200 + 1800 * load) * (0.9 + 0.2 * _unit(target, i)))
    p50 = 30 + 40 * load + 5 * _unit(target, "p50", i)
    return (
        f"INFO: served {served} requests in the last 60s (p50 {p50:.0f} ms, "
        f"p99 {p50 * 3.8:.0f} ms, {served * 0.4:.0f} tokens/s out)"
    )


def _interactive_line(target: LogTarget, i: int) -> str:
    pick = _unit(target, i)
    if pick < 0.2:
        return "[I ServerApp] Saving file at /work/notebook.ipynb"
    if pick < 0.3:
        return "[I ServerApp] Kernel started: python3"
    if pick < 0.4:
        return "[I ServerApp] Starting buffering for kernel python3"
    return "[I ServerApp] 200 GET /api/kernels (127.0.0.1) 1.2ms"


_TRAINING = _Script(
    prologue=(
        (0.0, "Loading dataset shards from /data ..."),
        (2.0, "Initialising process group: backend=nccl"),
        (4.0, "NCCL INFO Bootstrap : Using eth0"),
        (6.0, "Resuming from the latest checkpoint if there is one"),
        (8.0, "Training started"),
    ),
    every_s=30.0,
    body=_training_line,
)
SCRIPTS: dict[str, _Script] = {
    "training": _TRAINING,
    "fine-tuning": _TRAINING,
    "evaluation": _Script(
        ((0.0, "Loading evaluation set ..."), (3.0, "Evaluation started")), 15.0, _batch_line
    ),
    "batch": _Script(
        ((0.0, "Reading input manifest ..."), (2.0, "Batch started")), 15.0, _batch_line
    ),
    "inference": _Script(
        (
            (0.0, "INFO: loading model weights ..."),
            (20.0, "INFO: model loaded; KV cache allocated"),
            (22.0, "INFO: Uvicorn running on http://0.0.0.0:8000"),
        ),
        60.0,
        _inference_line,
    ),
    "interactive": _Script(
        (
            (0.0, "[I ServerApp] jupyterlab extension loaded"),
            (1.0, "[I ServerApp] Serving notebooks from local directory: /work"),
            (2.0, "[I ServerApp] Jupyter Server is running at http://0.0.0.0:8888/lab"),
        ),
        300.0,
        _interactive_line,
    ),
}

EPILOGUES: dict[str, tuple[str, ...]] = {
    "succeeded": ("Finished: outputs saved to /ckpt/final", "exit code 0"),
    "failed": (
        "Traceback (most recent call last):",
        '  File "/app/train.py", line 212, in <module>',
        "    main()",
        '  File "/app/train.py", line 187, in main',
        "    loss.backward()",
        "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
        "exit code 1",
    ),
    "oom": (
        "Traceback (most recent call last):",
        '  File "/app/train.py", line 181, in main',
        "    outputs = model(**batch)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 1.12 GiB is free.",
        "exit code 137 (OOMKilled)",
    ),
    "stopped": (
        "Received SIGTERM: saving a checkpoint before exiting",
        "Checkpoint saved; exiting",
    ),
}


def _lines(target: LogTarget, upto: datetime) -> tuple[int, Callable[[int], LogLine]]:
    """How many lines the pod has written by `upto`, and line `i` of them."""
    script = SCRIPTS.get(target.job_type, _TRAINING)
    end = min(upto, target.ended_at) if target.ended_at else upto
    elapsed = (end - target.started_at).total_seconds()
    opening = sum(1 for at, _ in script.prologue if at <= elapsed)
    first_body = script.prologue[-1][0] + script.every_s
    body = 0 if elapsed < first_body else int((elapsed - first_body) // script.every_s) + 1
    ended = target.ended_at is not None and target.ended_at <= upto
    epilogue = EPILOGUES.get(target.outcome, ()) if ended else ()
    prologue_n = len(script.prologue)

    def line(i: int) -> LogLine:
        if i < prologue_n:
            at, text = script.prologue[i]
        elif i < prologue_n + body:
            at = first_body + (i - prologue_n) * script.every_s
            text = script.body(target, i - prologue_n)
        else:
            at, text = elapsed, epilogue[i - prologue_n - body]
        return LogLine(target.started_at + timedelta(seconds=at), text)

    if opening < prologue_n:
        return opening, line
    return prologue_n + body + len(epilogue), line


def sim_log(
    target: LogTarget, *, now: datetime, tail: int | None = None, cursor: str = ""
) -> LogPage:
    """The lines written by `now`: the last `tail`, or those after `cursor` (a line number),
    at most PAGE_LINES of them."""
    count, line = _lines(target, now)
    if cursor:
        if not cursor.isdigit() or len(cursor) > 12:
            raise ValueError(f"not a log cursor: {cursor!r}")
        first = min(int(cursor), count)
        last = min(count, first + PAGE_LINES)
    else:
        last = count
        first = max(0, count - min(tail or PAGE_LINES, PAGE_LINES))
    return LogPage(tuple(line(i) for i in range(first, last)), str(last))


@dataclass
class SimulatedLogs:
    """The simulated cluster's LogSource. `clock` and `sleep` are injected so that following
    a log in a test takes no wall-clock time."""

    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    sleep: Callable[[float], None] = time.sleep
    poll_s: float = 2.0

    def read_log(
        self, target: LogTarget, *, now: datetime, tail: int | None = None, cursor: str = ""
    ) -> LogPage:
        return sim_log(target, now=now, tail=tail, cursor=cursor)

    def follow_log(self, target: LogTarget, *, tail: int | None = None) -> Iterator[LogLine]:
        cursor = ""
        while True:
            now = self.clock()
            page = sim_log(target, now=now, tail=tail, cursor=cursor)
            yield from page.lines
            cursor = page.cursor
            if len(page.lines) == PAGE_LINES:
                continue  # more written already: no wait
            if target.ended_at is not None and target.ended_at <= now:
                return
            self.sleep(self.poll_s)
