"""Where live configuration comes from: a watched file, or a Redis-backed config centre.

Both sources hand every new document to :meth:`Registry.reload`, which validates it first: an
invalid document is rejected with a ``config_rejected`` event and the last good configuration
stays in force. A source never raises into the application; it reports through events and
``last_error``.

* :class:`FileSource` polls the file's content every ``interval`` seconds (default 1 s) on the
  injected clock and reloads when it changed. Polling a hash is portable (containers, network
  mounts, editors that replace the file) and costs one ``stat`` plus one read per change.
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

from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall.config.loader import loads, parse
from floodwall.config.registry import Registry

__all__ = ["FileSource", "RedisSource"]


class FileSource:
    """Reload ``registry`` whenever the file at ``path`` changes."""

    def __init__(
        self,
        path: str | Path,
        registry: Registry,
        *,
        interval: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        if not interval > 0:
            raise ConfigError(f"interval must be > 0 seconds, got {interval!r}")
        self.path = Path(path)
        self.registry = registry
        self.interval = float(interval)
        self.clock = clock or registry.clock
        self.last_error: str | None = None
        self.reloads = 0
        self._digest: str | None = None
        self._stop = threading.Event()
        try:
            self._digest = self._read_digest()[1]
        except OSError:
            self._digest = None

    def _read_digest(self) -> tuple[str, str]:
        text = self.path.read_text(encoding="utf-8")
        return text, hashlib.sha256(text.encode()).hexdigest()

    def poll(self) -> bool:
        """Check the file once; reload if it changed. Returns True when a new config applied."""
        try:
            text, digest = self._read_digest()
        except OSError as exc:
            self.last_error = f"{self.path}: cannot read the file: {exc.strerror}"
            return False
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            self.registry.reload(text, str(self.path))
        except ConfigError as exc:
            self.last_error = str(exc)  # reload() emitted config_rejected; the old config stays
            return False
        self.last_error = None
        self.reloads += 1
        return True

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


class RedisSource:
    """A config centre on Redis: the document in ``key``, change notices on ``channel``.

    ``publish(text)`` (any instance, or an operator's tool) validates the document, stores it
    and notifies; every instance running :meth:`run` reloads. ``url`` is a ``redis://`` URL.
    """

    def __init__(
        self,
        url: str,
        registry: Registry,
        *,
        key: str = "floodwall:config",
        channel: str | None = None,
        interval: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.url = url
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
        """Validate ``text`` and make it every instance's configuration."""
        parse(loads(text, source), source)  # refuse to publish what nobody could apply
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
            self.registry.reload(text, source)
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
