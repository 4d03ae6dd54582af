"""Structured logs: one JSON line per event (state changes with reasons, sampled rejections).

``JsonLogListener`` is an event listener: add it to a registry (or any policy) and every event
becomes one line on a :mod:`logging` logger, at INFO for decisions and WARNING for rejections
and rejected configurations. Rejections reach it already sampled by the registry (at most one
per resource and outcome per second, with the number suppressed since the last one).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from floodwall._core.events import Event

__all__ = ["JsonLogListener"]

_WARNING_KINDS = frozenset({"rejected", "config_rejected", "thread_abandoned", "budget_exhausted"})


class JsonLogListener:
    """Writes each event as one JSON object on ``logger`` (default ``"floodwall"``).

    ``skip`` names event kinds not worth a line each; by default ``attempt`` (one per call
    through a Retry: the counters already say it). Rejections are logged from the registry's
    sampled ``rejected`` events only; a limiter's or bulkhead's own per-call ``rejected`` events
    are left to the counters (``unsampled_rejections=True`` logs them too).
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        skip: frozenset[str] = frozenset({"attempt"}),
        unsampled_rejections: bool = False,
    ) -> None:
        self.logger = logger or logging.getLogger("floodwall")
        self.skip = skip
        self.unsampled_rejections = unsampled_rejections

    def __call__(self, event: Event) -> None:
        if event.kind in self.skip:
            return
        if (
            event.kind == "rejected"
            and event.source != "resource"
            and not self.unsampled_rejections
        ):
            return
        record: dict[str, Any] = {
            "event": event.kind,
            "source": event.source,
            "name": event.name,
            "time": event.time,
            "reason": event.reason,
        }
        if event.from_state is not None:
            record["from"] = event.from_state
            record["to"] = event.to_state
        if event.figures:
            record["figures"] = dict(event.figures)
        level = logging.WARNING if event.kind in _WARNING_KINDS else logging.INFO
        self.logger.log(level, json.dumps(record, default=str, sort_keys=True))
