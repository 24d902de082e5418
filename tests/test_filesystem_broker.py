"""The embedded default's broker (common/filesystem_broker.py): a worker never reads a message
file before it is whole. kombu's own filesystem transport created the file, then wrote it: a
worker polling in between got an empty file, and died of a JSONDecodeError, taking `make run`
down with it (seen in tests/test_run_embedded.py's concurrent writers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection
from kombu.transport import filesystem

from common import filesystem_broker
from common.filesystem_broker import Transport
from config.celery import app as celery_app


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Any]:
    folders = {
        "data_folder_in": str(tmp_path / "queue"),
        "data_folder_out": str(tmp_path / "queue"),
        "control_folder": str(tmp_path / "control"),
        "store_processed": False,
    }
    for folder in ("queue", "control"):
        (tmp_path / folder).mkdir()
    with Connection(transport=Transport, transport_options=folders) as connection:
        yield connection.default_channel


def test_a_message_being_written_is_not_read_half_written(
    channel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker polls while the web process is writing a message: it must find nothing yet
    (kombu's transport handed it the empty file: JSONDecodeError), then the whole message."""
    seen_while_writing: list[Any] = []
    real_dumps = filesystem_broker.dumps

    def dumps_while_polled(payload: Any) -> str:
        try:
            seen_while_writing.append(channel._get("jobs"))
        except Empty:
            seen_while_writing.append("nothing")
        return str(real_dumps(payload))

    # Both names: kombu's Channel serialises through its module's `dumps`, ours through ours.
    monkeypatch.setattr(filesystem_broker, "dumps", dumps_while_polled)
    monkeypatch.setattr(filesystem, "dumps", dumps_while_polled)
    channel._put("jobs", {"task": "notify", "id": 7})
    assert seen_while_writing == ["nothing"]
    assert channel._get("jobs") == {"task": "notify", "id": 7}


def test_a_message_file_that_is_not_json_is_dropped_and_the_next_delivered(
    channel: Any, tmp_path: Path
) -> None:
    (tmp_path / "queue" / f"{0:020d}_junk.jobs.msg").write_bytes(b"")  # named first
    channel._put("jobs", {"task": "notify", "id": 8})
    with pytest.raises(Empty):
        channel._get("jobs")  # the empty file, dropped
    assert channel._get("jobs") == {"task": "notify", "id": 8}
    assert list((tmp_path / "queue").iterdir()) == []


def test_messages_are_taken_in_the_order_they_were_put_whatever_the_clock_s_digits(
    channel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader sorts file names as text: a clock that gains a digit between two messages
    (999 -> 1000) must not put the second one first."""
    ticks = iter([999, 1000, 10_000_000_000])
    monkeypatch.setattr(filesystem_broker, "time_ns", lambda: next(ticks))
    for n in range(3):
        channel._put("jobs", {"task": "notify", "id": n})
    assert [channel._get("jobs")["id"] for _ in range(3)] == [0, 1, 2]


def test_the_embedded_default_uses_it() -> None:
    if settings.REDIS_URL:
        pytest.skip("Redis is the broker here")
    with celery_app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)
