"""Pod logs through the apiserver (`pods/log`), for the Kubernetes backend.

Lines are asked for with `timestamps=true`: the kubelet prefixes each with the time it was
written (RFC 3339, nanoseconds, trailing zeros dropped), and that time is the cursor. The
client (v37) has no `sinceTime`, so a read after a cursor asks for `sinceSeconds` reaching a
little before it (the kubelet's clock and ours differ) and drops what it had already seen:
the cursor keeps the time of the last line and how many lines carried exactly that time.

What the apiserver answers when there is no log to read, and what a person is told:
- 404 `pods "x" not found`: the pod is gone (deleted, its node lost) and its log with it;
- 400 `container "main" in pod "x" is waiting to start: ContainerCreating` (or an image pull
  reason): not started yet;
- 400 `pod x does not have a host assigned`: not bound to a node yet.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from scheduler.backends.base import BackendError, LogLine, LogPage, LogTarget, LogUnavailable
from scheduler.backends.kubernetes.render import CONTAINER

PAGE_LINES = 1000
# The most bytes one read takes from the kubelet; a busy pod's next read continues from there.
LIMIT_BYTES = 4 * 1024 * 1024
# Seconds added to a cursor's `sinceSeconds`: the kubelet's clock may run behind ours.
CLOCK_SLACK_S = 30
# A followed log with nothing to say for this long is asked again (from its cursor): a quiet
# connection cannot be told from a dead one otherwise.
FOLLOW_READ_TIMEOUT_S = 300.0


def _key(stamp: str) -> str:
    """An order-preserving key of a kubelet timestamp (2026-01-02T03:04:05.12Z: the fraction
    padded to nanoseconds, so that string order is time order)."""
    whole, _, rest = stamp.partition(".")
    fraction = rest.rstrip("Z")
    return f"{whole.rstrip('Z')}.{fraction.ljust(9, '0')}"


def _when(stamp: str) -> datetime | None:
    try:
        whole, _, rest = stamp.rstrip("Z").partition(".")
        at = datetime.fromisoformat(whole).replace(tzinfo=UTC)
        return at + timedelta(microseconds=int((rest or "0")[:6].ljust(6, "0")))
    except ValueError:
        return None


def parse(text: str) -> list[tuple[str, LogLine]]:
    """(timestamp, line) for each line of a `timestamps=true` answer."""
    out = []
    for raw in text.splitlines():
        stamp, _, rest = raw.partition(" ")
        at = _when(stamp)
        out.append((stamp, LogLine(at, rest)) if at else ("", LogLine(None, raw)))
    return out


def _cursor_of(cursor: str) -> tuple[str, int]:
    stamp, _, seen = cursor.rpartition("|")
    if not stamp or not seen.isdigit() or _when(stamp) is None:
        raise ValueError(f"not a log cursor: {cursor!r}")
    return stamp, int(seen)


def after(lines: Iterable[tuple[str, LogLine]], cursor: str) -> list[tuple[str, LogLine]]:
    """The lines after `cursor` ("" : all of them)."""
    if not cursor:
        return list(lines)
    stamp, seen = _cursor_of(cursor)
    key, kept, same = _key(stamp), [], 0
    for line_stamp, line in lines:
        line_key = _key(line_stamp) if line_stamp else ""
        if line_key == key:
            same += 1
            if same <= seen:
                continue
        elif line_key < key:
            continue
        kept.append((line_stamp, line))
    return kept


def next_cursor(previous: str, lines: list[tuple[str, LogLine]]) -> str:
    """The cursor after `lines` were read from `previous`."""
    stamped = [stamp for stamp, _ in lines if stamp]
    if not stamped:
        return previous
    last = stamped[-1]
    count = sum(1 for stamp in stamped if _key(stamp) == _key(last))
    if previous and len(stamped) == count:  # every new line shares the cursor's time
        stamp, seen = _cursor_of(previous)
        if _key(stamp) == _key(last):
            count += seen
    return f"{last}|{count}"


def unavailable(exc: ApiException, target: LogTarget) -> LogUnavailable | None:
    """What a refusal of `pods/log` means for the person reading, or None if it is no such
    refusal (the caller raises it as it would any other)."""
    if exc.status == 404:
        return LogUnavailable(
            f"pod {target.pod} is gone (deleted, or its node was lost); its log went with it"
        )
    if exc.status != 400:
        return None
    try:
        message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        message = str(exc.reason)
    if "does not have a host assigned" in message:
        return LogUnavailable(f"pod {target.pod} has not been bound to a node yet")
    if "waiting to start" in message:
        why = message.rsplit(":", 1)[-1].strip()
        return LogUnavailable(f"pod {target.pod} has not started yet ({why})")
    return LogUnavailable(f"pod {target.pod}: the cluster has no log for it ({message[:300]})")


def read_page(
    fetch: Callable[..., str], target: LogTarget, *, now: datetime, tail: int | None, cursor: str
) -> LogPage:
    """One read through `fetch(**query)` (the backend's retried call), as LogSource.read_log."""
    query: dict[str, Any] = {"container": CONTAINER, "timestamps": True, "limit_bytes": LIMIT_BYTES}
    if cursor:
        stamp, _ = _cursor_of(cursor)
        since = (now - (_when(stamp) or now)).total_seconds()
        query["since_seconds"] = max(1, math.ceil(since) + CLOCK_SLACK_S)
    else:
        query["tail_lines"] = min(tail or PAGE_LINES, PAGE_LINES)
    lines = after(parse(fetch(**query)), cursor)[:PAGE_LINES]
    return LogPage(tuple(line for _, line in lines), next_cursor(cursor, lines))


def stream_lines(response: Any) -> Iterator[str]:
    """Whole lines of a streamed answer, as they arrive."""
    pending = b""
    try:
        for chunk in response.stream(64 * 1024, decode_content=True):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                yield raw.decode(errors="replace")
        if pending:
            yield pending.decode(errors="replace")
    finally:
        response.release_conn()


def follow(
    open_stream: Callable[..., Any], target: LogTarget, *, tail: int | None
) -> Iterator[LogLine]:
    """The last `tail` lines, then each new one, until the container ends (the apiserver
    closes the stream). A stream quiet past FOLLOW_READ_TIMEOUT_S is opened again from the
    cursor, so a dead connection is noticed and nothing is shown twice. A stream broken off
    mid-way (connection reset, a truncated chunk: the apiserver or a proxy restarted) ends
    the follow with a BackendError that says so, never a raw urllib3 error: the lines shown
    so far stand, and the caller follows again (the CLI polls from its cursor)."""
    cursor, shown = "", 0
    query: dict[str, Any] = {"tail_lines": min(tail or PAGE_LINES, PAGE_LINES)}
    while True:
        try:
            response = open_stream(container=CONTAINER, timestamps=True, follow=True, **query)
        except ApiException as exc:
            refusal = unavailable(exc, target)
            if refusal is None:
                raise
            raise refusal from exc
        except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
            raise BackendError(
                f"the cluster could not be asked for the log of pod {target.pod} "
                f"({type(exc).__name__})"
            ) from exc
        resume = _Resume(cursor)
        try:
            for raw in stream_lines(response):
                for stamp, line in parse(raw):
                    if resume.seen(stamp):
                        continue
                    cursor = next_cursor(cursor, [(stamp, line)])
                    shown += 1
                    yield line
            return
        except urllib3.exceptions.ReadTimeoutError:
            stamp = _cursor_of(cursor)[0] if cursor else ""
            seconds = (datetime.now(UTC) - (_when(stamp) or datetime.now(UTC))).total_seconds()
            query = {"since_seconds": max(1, math.ceil(seconds) + CLOCK_SLACK_S)}
        except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
            raise BackendError(
                f"the cluster broke off the log of pod {target.pod} after {shown} "
                f"line{'' if shown == 1 else 's'} ({type(exc).__name__}); follow it again "
                "to read on"
            ) from exc


class _Resume:
    """Skips, line by line, what a reopened stream repeats from before `cursor`."""

    def __init__(self, cursor: str) -> None:
        self.key, self.left = "", 0
        if cursor:
            stamp, self.left = _cursor_of(cursor)
            self.key = _key(stamp)

    def seen(self, stamp: str) -> bool:
        if not self.key or not stamp:
            return False
        key = _key(stamp)
        if key < self.key:
            return True
        if key == self.key and self.left > 0:
            self.left -= 1
            return True
        self.key = ""  # past the cursor: everything from here is new
        return False
