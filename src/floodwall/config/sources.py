"""Where live configuration comes from: a watched file, or a Redis-backed config centre.

Both sources hand every new document to :meth:`Registry.reload`, which validates it first: an
invalid document is rejected with a ``config_rejected`` event and the last good configuration
stays in force. A source never raises into the application; it reports through events and
``last_error``.

* :class:`FileSource` polls the file's content every ``interval`` seconds (default 1 s) on the
  injected clock and reloads when it changed and stood still for one more poll (so a change
  applies within two intervals, and a file caught mid-write never does). Polling a hash is
  portable (containers, network mounts, editors that replace the file) and costs two ``stat``
  calls and one read per poll.
* :class:`RedisSource` keeps the document in one Redis key and announces changes on a pub/sub
  channel; every instance subscribed applies a change as soon as the message arrives (well
  under a second on a LAN), and re-reads the key on (re)connect so a missed message is never
  lost for longer than ``interval``.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from pathlib import Path
from typing import Any

from floodwall._core import validate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall.config.loader import loads, parse
from floodwall.config.registry import Registry

__all__ = ["FileSource", "RedisSource"]


class FileSource:
    """Reload ``registry`` whenever the file at ``path`` changes, never from a half-written one.

    A writer that does not rename atomically leaves the file empty, then partly written, for a
    while. So a change applies only when it is whole by three signs: the file did not change
    while it was read; a second poll (one ``interval`` later) reads the same bytes (``settle``;
    ``settle=False`` applies at first sight, for writers that always rename); and a YAML or
    TOML file ends with a newline (a last line without one was cut short; JSON cut short never
    parses). An empty file, or one without resources, is refused by :meth:`Registry.reload`
    unless ``allow_empty=True``. A refused file keeps the last good configuration and is
    reported (a ``config_rejected`` event, a warning log line naming the file and the reason,
    :attr:`last_error`) once per content.
    """

    def __init__(
        self,
        path: str | Path,
        registry: Registry,
        *,
        interval: float = 1.0,
        settle: bool = True,
        allow_empty: bool = False,
        clock: Clock | None = None,
    ) -> None:
        validate.seconds("interval", interval, positive=True)
        self.path = Path(path)
        self.registry = registry
        self.interval = float(interval)
        self.settle = bool(settle)
        self.allow_empty = bool(allow_empty)
        self.clock = clock or registry.clock
        self.last_error: str | None = None
        self.reloads = 0
        self._digest: str | None = None
        """The content last applied or refused (never retried until it changes)."""
        self._pending: str | None = None
        """A change seen once, waiting for the next poll to read it unchanged."""
        self._stop = threading.Event()
        try:
            self._digest = self._read()[1]
        except (OSError, _Changing):
            self._digest = None

    def _read(self) -> tuple[bytes, str]:
        before = self.path.stat()
        data = self.path.read_bytes()
        after = self.path.stat()
        stamp = (before.st_size, before.st_mtime_ns)
        if stamp != (after.st_size, after.st_mtime_ns) or len(data) != before.st_size:
            raise _Changing
        return data, hashlib.sha256(data).hexdigest()

    def poll(self) -> bool:
        """Check the file once; reload if it changed. Returns True when a new config applied."""
        try:
            data, digest = self._read()
        except OSError as exc:
            self.last_error = f"{self.path}: cannot read the file: {exc.strerror}"
            return False
        except _Changing:
            self._pending = None  # being written: wait for it to stand still
            return False
        if digest == self._digest:
            self._pending = None
            return False
        if self.settle and digest != self._pending:
            self._pending = digest
            return False
        self._pending = None
        self._digest = digest
        try:
            self.registry.reload(self._text(data), str(self.path), allow_empty=self.allow_empty)
        except ConfigError as exc:
            self.last_error = str(exc)  # reload() reported it; the old config stays
            return False
        self.last_error = None
        self.reloads += 1
        return True

    def _text(self, data: bytes) -> str:
        """The file's text, or a refusal (reported like any invalid document)."""
        source = str(self.path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            error = ConfigError(f"{source}: not UTF-8 text (caught mid-write?): {exc.reason}")
            self.registry._refuse(source, error)
            raise error from None
        if text.strip() and not text.endswith("\n") and not source.endswith(".json"):
            error = ConfigError(
                f"{source}: the last line has no newline, so the file looks cut short "
                "(caught mid-write?); end the file with a newline"
            )
            self.registry._refuse(source, error)
            raise error
        return text

    async def run(self) -> None:
        """Poll forever (until cancelled or :meth:`stop`) on the clock's async sleep."""
        while not self._stop.is_set():
            self.poll()
            await self.clock.async_sleep(self.interval)

    def start_thread(self) -> threading.Thread:
        """Poll in a daemon thread (for sync applications); stop with :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.poll()

        thread = threading.Thread(
            target=loop, name=f"floodwall-config-{self.path.name}", daemon=True
        )
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()


class _Changing(Exception):  # noqa: N818 - a signal inside FileSource, never raised out of it
    """The file changed while it was read."""


class RedisSource:
    """A config centre on Redis: the document in ``key``, change notices on ``channel``.

    ``publish(text)`` (any instance, or an operator's tool) validates the document, stores it
    and notifies; every instance running :meth:`run` reloads. ``url`` is a ``redis://`` URL.
    ``allow_empty`` lets a document without resources through (see :meth:`Registry.reload`).
    """

    def __init__(
        self,
        url: str,
        registry: Registry,
        *,
        key: str = "floodwall:config",
        channel: str | None = None,
        interval: float = 5.0,
        allow_empty: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.url = url
        self.allow_empty = bool(allow_empty)
        self.registry = registry
        self.key = key
        self.channel = channel or f"{key}:changed"
        self.interval = float(interval)
        self.clock = clock
        self.last_error: str | None = None
        self.reloads = 0
        self._applied: str | None = None

    def _client(self) -> Any:
        import redis.asyncio

        return redis.asyncio.Redis.from_url(self.url)

    async def publish(self, text: str, source: str = "<publish>") -> None:
        """Validate ``text`` and make it every instance's configuration (a document without
        resources only with ``allow_empty=True``: every instance would refuse it otherwise)."""
        document = parse(loads(text, source), source)  # refuse what nobody could apply
        if not document.resources and not self.allow_empty:
            raise ConfigError(
                f"{source}: the document has no resources; publishing it would drop every "
                "resource (RedisSource(..., allow_empty=True) does it on purpose)"
            )
        client = self._client()
        try:
            await client.set(self.key, text)
            await client.publish(self.channel, hashlib.sha256(text.encode()).hexdigest())
        finally:
            await client.aclose()

    async def _apply_current(self, client: Any) -> None:
        raw = await client.get(self.key)
        if raw is None:
            return
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest == self._applied:
            return
        self._applied = digest
        source = f"redis:{self.key}"
        try:
            self.registry.reload(text, source, allow_empty=self.allow_empty)
        except ConfigError as exc:
            self.last_error = str(exc)
            return
        self.last_error = None
        self.reloads += 1

    async def run(self) -> None:
        """Follow the config centre until cancelled; reconnects after Redis errors."""
        import redis.exceptions

        while True:
            client = self._client()
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                await self._apply_current(client)
                while True:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=self.interval
                    )
                    await self._apply_current(client)  # on a notice, and every interval
                    del message
            except (redis.exceptions.RedisError, OSError) as exc:
                self.last_error = f"config centre unavailable: {exc}"
                await self.clock.async_sleep(min(self.interval, 1.0))
            finally:
                with contextlib.suppress(redis.exceptions.RedisError, OSError):
                    await pubsub.aclose()
                    await client.aclose()
