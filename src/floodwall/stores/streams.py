"""Redis Streams as a durable, bounded queue with at-least-once delivery (consumer groups).

:class:`RedisStream` is the adapter :class:`~floodwall.WriteBehind` uses when writes
must survive a process restart. It follows the stores layer's conventions: it runs on a
:class:`~floodwall.stores.redis.RedisStore` (its clients, timeouts and URL; any ``redis://``,
``rediss://`` or ``redis+cluster://`` URL), its multi-step commands are Lua scripts of the
package called by SHA (``lua/stream_add.lua``, ``lua/stream_ack.lua``), every backend error
surfaces as :class:`~floodwall.stores.StoreUnavailableError`, and every operation has a sync
and an async form with the same name (``add``/``add_async``…).

The stream lives under ``<prefix>{stream:<name>}`` (a hash tag: one cluster slot). Semantics:

* ``add(fields)`` appends an entry unless the stream already holds ``max_length`` entries
  (then ``None``): bounded, and never trimmed, since trimming would lose unprocessed writes;
* ``read(count)`` hands this consumer, oldest first: its own **pending** entries (delivered
  before and never acknowledged: after a crash and restart under the same ``consumer`` name,
  exactly the entries it was working on), else entries another consumer left pending for more
  than ``claim_after`` seconds (``XAUTOCLAIM``: a consumer that died for good), else new ones;
* ``ack(ids)`` acknowledges *and deletes* entries in one step, so the stream's length is the
  backlog, which is what the bound counts.

An entry is delivered until it is acknowledged: at least once. Duplicates happen (a crash after
the work and before the ack; a command retried after a lost reply); consumers deduplicate by a
key carried in the entry. Order is the stream's for one consumer; several consumers of one
group share the entries and do not keep a global order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from floodwall._core import defaults, validate
from floodwall._core.errors import ConfigError
from floodwall.stores.base import StoreUnavailableError
from floodwall.stores.redis import RedisStore, load_script

__all__ = ["RedisStream", "StreamEntry"]

_BACKEND_ERRORS = (RedisError, RedisClusterException, OSError)


class StreamEntry(NamedTuple):
    """One entry: its stream ``id`` and its ``fields`` (bytes to bytes)."""

    id: str
    fields: dict[bytes, bytes]


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _entries(raw: Any) -> list[StreamEntry]:
    """Entries from an ``XREADGROUP`` reply (RESP2 list or RESP3 map) or a list of entries."""
    if not raw:
        return []
    streams = list(raw.values()) if isinstance(raw, dict) else [item[1] for item in raw]
    found: list[StreamEntry] = []
    for stream in streams:
        items = stream[0] if stream and isinstance(stream[0], list) else stream
        found.extend(_entry_list(items))
    return found


def _entry_list(items: Any) -> list[StreamEntry]:
    return [
        StreamEntry(_text(entry_id), dict(fields))
        for entry_id, fields in (item[:2] for item in items or ())
        if entry_id is not None and fields is not None
    ]


class RedisStream:
    """A consumer-group view of one Redis stream (see [Distributed state][guide-distributed])."""

    def __init__(
        self,
        store: RedisStore | str,
        name: str,
        *,
        consumer: str,
        group: str = "floodwall",
        max_length: int = defaults.WRITE_BEHIND_MAX_PENDING,
        claim_after: float | None = defaults.WRITE_BEHIND_CLAIM_AFTER,
        **store_options: Any,
    ) -> None:
        if isinstance(store, str):
            store = RedisStore(store, **store_options)
        if not isinstance(store, RedisStore):
            raise ConfigError(f"store must be a RedisStore or a redis:// URL, got {store!r}")
        for option, value in (("name", name), ("consumer", consumer), ("group", group)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{option} must be a non-empty string, got {value!r}")
        validate.count("max_length", max_length)
        if claim_after is not None:
            validate.seconds("claim_after", claim_after, positive=True)
        self.store = store
        self.name = validate.text("name", name)
        self.consumer = consumer
        self.group = group
        self.max_length = max_length
        self.claim_after = claim_after
        self.key = f"{store.prefix}{{stream:{name}}}"
        self._group_ready = False

    @property
    def url(self) -> str:
        return self.store.url

    def _fail(self, op: str, exc: Exception) -> NoReturn:
        """Raise the typed store error for a client's ``exc`` during ``op`` (any exception once
        the store is closed: a socket closed under a command raises ``ValueError``); an error
        that is not the client's propagates as it is."""
        if isinstance(exc, StoreUnavailableError):
            raise exc
        if isinstance(exc, _BACKEND_ERRORS) or self.store.closed:
            raise self.store.error_for(exc, op) from exc
        raise exc

    # -- sync -----------------------------------------------------------------------------------

    def _script(self, client: Any, name: str, args: Sequence[Any]) -> Any:
        script = load_script(name)
        try:
            return client.execute_command("EVALSHA", script.sha, 1, self.key, *args)
        except NoScriptError:
            return client.execute_command("EVAL", script.source, 1, self.key, *args)

    def _ensure_group(self, client: Any) -> None:
        if self._group_ready:
            return
        try:
            client.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def add(self, fields: Mapping[str, bytes | str]) -> str | None:
        """Append an entry; its id, or ``None`` when the stream is full."""
        argv: list[int | bytes | str] = [self.max_length]
        for field, value in fields.items():
            argv.extend((field, value))
        try:
            raw = self._script(self.store.client(), "stream_add", argv)
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_add", exc)
        return None if raw is None else _text(raw)

    def read(self, count: int) -> list[StreamEntry]:
        """Up to ``count`` entries for this consumer: its pending ones, else stale ones of
        other consumers, else new ones (see [Distributed state][guide-distributed])."""
        try:
            client = self.store.client()
            self._ensure_group(client)
            try:
                return self._read(client, count)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._group_ready = False  # the stream was deleted under us: start over
                self._ensure_group(client)
                return self._read(client, count)
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_read", exc)

    def _read(self, client: Any, count: int) -> list[StreamEntry]:
        mine = _entries(client.xreadgroup(self.group, self.consumer, {self.key: "0"}, count=count))
        if mine:
            return mine
        if self.claim_after is not None:
            reply = client.xautoclaim(
                self.key, self.group, self.consumer, round(self.claim_after * 1000), "0-0", count
            )
            claimed = _entry_list(reply[1])
            if claimed:
                return claimed
        return _entries(client.xreadgroup(self.group, self.consumer, {self.key: ">"}, count=count))

    def ack(self, ids: Sequence[str]) -> int:
        """Acknowledge and delete ``ids``; how many were pending."""
        if not ids:
            return 0
        try:
            raw = self._script(self.store.client(), "stream_ack", [self.group, *ids])
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_ack", exc)
        return int(raw)

    def length(self) -> int:
        """Entries in the stream: the backlog (delivered or not, not yet acknowledged)."""
        try:
            return int(self.store.client().xlen(self.key))
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_length", exc)

    def delete(self) -> None:
        """Remove the stream and its group (tests, decommissioning)."""
        try:
            self.store.client().delete(self.key)
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_delete", exc)
        self._group_ready = False

    # -- async ----------------------------------------------------------------------------------

    async def _script_async(self, client: Any, name: str, args: Sequence[Any]) -> Any:
        script = load_script(name)
        try:
            return await client.execute_command("EVALSHA", script.sha, 1, self.key, *args)
        except NoScriptError:
            return await client.execute_command("EVAL", script.source, 1, self.key, *args)

    async def _ensure_group_async(self, client: Any) -> None:
        if self._group_ready:
            return
        try:
            await client.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def add_async(self, fields: Mapping[str, bytes | str]) -> str | None:
        """:meth:`add` for async callers."""
        argv: list[int | bytes | str] = [self.max_length]
        for field, value in fields.items():
            argv.extend((field, value))
        try:
            client = await self.store.async_client()
            raw = await self._script_async(client, "stream_add", argv)
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_add", exc)
        return None if raw is None else _text(raw)

    async def read_async(self, count: int) -> list[StreamEntry]:
        """:meth:`read` for async callers."""
        try:
            client = await self.store.async_client()
            await self._ensure_group_async(client)
            try:
                return await self._read_async(client, count)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._group_ready = False
                await self._ensure_group_async(client)
                return await self._read_async(client, count)
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_read", exc)

    async def _read_async(self, client: Any, count: int) -> list[StreamEntry]:
        mine = _entries(
            await client.xreadgroup(self.group, self.consumer, {self.key: "0"}, count=count)
        )
        if mine:
            return mine
        if self.claim_after is not None:
            reply = await client.xautoclaim(
                self.key, self.group, self.consumer, round(self.claim_after * 1000), "0-0", count
            )
            claimed = _entry_list(reply[1])
            if claimed:
                return claimed
        return _entries(
            await client.xreadgroup(self.group, self.consumer, {self.key: ">"}, count=count)
        )

    async def ack_async(self, ids: Sequence[str]) -> int:
        """:meth:`ack` for async callers."""
        if not ids:
            return 0
        try:
            client = await self.store.async_client()
            raw = await self._script_async(client, "stream_ack", [self.group, *ids])
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_ack", exc)
        return int(raw)

    async def length_async(self) -> int:
        """:meth:`length` for async callers."""
        try:
            client = await self.store.async_client()
            return int(await client.xlen(self.key))
        except Exception as exc:  # noqa: BLE001 - sorted by _fail
            self._fail("stream_length", exc)

    def __repr__(self) -> str:
        return f"RedisStream({self.name!r}, consumer={self.consumer!r}, store={self.store.url})"
