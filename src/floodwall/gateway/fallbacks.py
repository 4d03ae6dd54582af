"""What a failing route answers instead: the last good answer, a backup upstream, a static one.

The seeds' gift list: when the gift service is down the gateway answers a few common gifts
from its configuration, so users can still send one. A route's ``fallback`` section combines
three sources, tried in ``order`` (default cache, backup, static) for the failures listed in
``on`` (open breaker, full bulkhead, timeout, shed level, overload, upstream 5xx or
unreachable; never a rate limit):

* **cache**: the last good answer to the same GET (same host, path, query and
  ``Accept-Encoding``), younger than ``ttl``. Bounded in entries and bytes (LRU). Never kept
  for a request carrying ``Authorization`` or ``Cookie``, nor for an answer that sets a cookie,
  says ``Cache-Control: private``/``no-store`` or varies on anything but ``Accept-Encoding``:
  a fallback must never show one user another user's data.
* **backup**: the same request sent to another upstream, through its own resource's policies
  (a backup is a dependency too; unprotected, it can hang the gateway a second time).
* **static**: ``status``, ``headers`` and ``json`` or ``body`` from the file.

Every degraded answer carries ``X-Degraded: <source>; reason=<failure>`` (plus
``age=<seconds>`` for the cache), so clients, logs and dashboards can tell it from the real
thing: the header and vocabulary of the library's integrations
(:func:`floodwall.integrations._wire.format_degraded`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from floodwall.gateway.config import CacheFallbackConfig, RouteFallbackConfig
from floodwall.integrations._wire import DEGRADED, format_degraded

__all__ = [
    "DEGRADED_HEADER",
    "Answer",
    "LastGood",
    "cache_key",
    "cacheable_request",
    "cacheable_response",
    "degraded_value",
    "static_answer",
]

DEGRADED_HEADER = DEGRADED
"""``X-Degraded``, as inbound middleware and outbound clients send it."""


@dataclass(slots=True)
class Answer:
    """A whole answer held in memory (a fallback, a cached answer, a failed upstream answer)."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    reason: str | None = None


def degraded_value(source: str, reason: str, age: float | None = None) -> str:
    """The ``X-Degraded`` value: ``"cache; reason=timeout; age=12"``."""
    return format_degraded(source, reason, age)


def static_answer(config: RouteFallbackConfig) -> Answer | None:
    """The static answer a fallback section describes, or ``None`` when it has none."""
    if config.status is None:
        return None
    headers = list(config.headers.items())
    names = {name.lower() for name, _ in headers}
    if config.json_body is not None:
        body = json.dumps(config.json_body, separators=(",", ":")).encode()
        if "content-type" not in names:
            headers.append(("Content-Type", "application/json"))
    elif config.body is not None:
        body = config.body.encode()
        if "content-type" not in names:
            headers.append(("Content-Type", "text/plain; charset=utf-8"))
    else:
        body = b""
    return Answer(config.status, headers, body)


def cache_key(host: str, path_qs: str, headers: Mapping[str, str]) -> str:
    """The last-good cache key of a GET: host, path with query, ``Accept-Encoding``."""
    return f"{host}\n{path_qs}\n{headers.get('accept-encoding', '')}"


def cacheable_request(method: str, headers: Mapping[str, str]) -> bool:
    """Whether an answer to this request may be kept: a GET without credentials."""
    return method == "GET" and "authorization" not in headers and "cookie" not in headers


def cacheable_response(
    status: int, headers: Mapping[str, str], config: CacheFallbackConfig
) -> bool:
    """Whether this upstream answer may be kept and shown to another client later."""
    if status not in config.statuses or "set-cookie" in headers:
        return False
    control = headers.get("cache-control", "").lower()
    if "private" in control or "no-store" in control:
        return False
    vary = headers.get("vary")
    if vary is not None:
        fields = {v.strip().lower() for v in vary.split(",") if v.strip()}
        if fields - {"accept-encoding"}:
            return False
    return True


class LastGood:
    """Last good answers by key: an LRU bounded by ``max_entries`` and ``max_bytes``, each
    entry kept ``ttl`` seconds. Pure (every call takes ``now``); thread-safe; O(1) amortised."""

    def __init__(self, config: CacheFallbackConfig) -> None:
        self.config = config
        self._data: OrderedDict[str, tuple[Answer, float, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.stores = 0
        self.evictions = 0

    def put(self, key: str, answer: Answer, now: float) -> bool:
        """Keep ``answer`` for ``key``; False when it is larger than ``max_body``."""
        size = len(answer.body) + sum(len(k) + len(v) for k, v in answer.headers) + len(key)
        if len(answer.body) > self.config.max_body or size > self.config.max_bytes:
            return False
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            self._data[key] = (answer, now, size)
            self._bytes += size
            self.stores += 1
            while len(self._data) > self.config.max_entries or self._bytes > self.config.max_bytes:
                _, (_, _, gone) = self._data.popitem(last=False)
                self._bytes -= gone
                self.evictions += 1
        return True

    def get(self, key: str, now: float) -> tuple[Answer, float] | None:
        """``(answer, age)`` of an entry younger than ``ttl``, else ``None``."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            answer, stored, size = entry
            if now - stored > self.config.ttl:
                del self._data[key]
                self._bytes -= size
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return answer, now - stored

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)
