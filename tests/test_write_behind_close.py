"""Issue 19, item 8: WriteBehind ``close(timeout)`` drains and reports what it dropped.

``stop()`` right after 400 submits used to apply none and lose all 400 silently; ``close``
drains within its timeout and reports anything left by count (event, log line, return value).
"""

from __future__ import annotations

import logging
import random

import pytest

import floodwall as fw
from floodwall.backoff import Fixed
from floodwall.shared import WriteBehind
from floodwall.shared.write_behind import _report_dropped_at_exit


class Sink:
    def __init__(self) -> None:
        self.rows: list[object] = []
        self.down = False

    def __call__(self, payload: object) -> None:
        if self.down:
            raise ConnectionError("database down")
        self.rows.append(payload)


def test_item8_write_behind_close_drains_every_queued_write(clock: fw.FakeClock) -> None:
    sink = Sink()
    events: list[fw.Event] = []
    writer = WriteBehind(sink, clock=clock, listeners=[events.append])
    for n in range(400):
        writer.submit(n)
    assert writer.close(timeout=1.0) == 0
    assert sink.rows == list(range(400))
    assert writer.pending() == 0
    assert "closed" not in [e.kind for e in events]


def test_item8_write_behind_close_reports_what_it_dropped(
    clock: fw.FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sink = Sink()
    sink.down = True
    events: list[fw.Event] = []
    writer = WriteBehind(
        sink, backoff=Fixed(0.5), rng=random.Random(1), clock=clock, listeners=[events.append]
    )
    for n in range(400):
        writer.submit(n)
    start = clock.monotonic()
    with caplog.at_level(logging.WARNING, logger="floodwall.degrade"):
        left = writer.close(timeout=2.0)
    assert left == 400
    assert clock.monotonic() - start == pytest.approx(2.0), "close waits no longer than its timeout"
    assert writer.failures == 4, "retried on its backoff while the timeout lasted"
    (closed,) = [e for e in events if e.kind == "closed"]
    assert closed.figures == {"left": 400, "durable": False}
    assert "400 writes not applied (dropped)" in caplog.text


def test_item8_write_behind_close_validates_its_timeout(clock: fw.FakeClock) -> None:
    writer = WriteBehind(Sink(), clock=clock)
    with pytest.raises(fw.ConfigError, match="timeout must be a finite number"):
        writer.close(timeout=-1)


def test_item8_write_behind_exit_logs_writes_left_in_memory(
    clock: fw.FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    writer = WriteBehind(Sink(), name="audit", clock=clock)
    for n in range(7):
        writer.submit(n)
    closed = WriteBehind(Sink(), name="closed-one", clock=clock)
    closed.submit(1)
    closed.close(timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="floodwall.degrade"):
        _report_dropped_at_exit()
    assert "'audit': process exiting with 7 writes in its memory queue, dropped" in caplog.text
    assert "closed-one" not in caplog.text
