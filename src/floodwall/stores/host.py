"""``host://NAME``: state shared by every process of one host, with no server.

Two System V IPC objects per NAME (per user), both visible to ``ipcs``:

* **one semaphore set** of ``2 + bulkheads`` semaphores: #0 is the *lock* of the segment
  (value 0 free, 1 held; taken with "wait for zero, then add one" and given back with
  ``SEM_UNDO``, so a process killed while holding it gives it back at its death and no counter
  is ever left locked), #1 counts the *processes using* NAME (``+1`` with ``SEM_UNDO`` when a
  process first uses it, so a dead process leaves the count), #2 onwards are the *slots* of
  host bulkheads (value = free slots; a call takes one with ``SEM_UNDO``, so the slots of a
  process killed mid-call come back when it dies);
* **one shared memory segment** of fixed size: a header, a directory of host bulkheads (name,
  size), and a table of ``max_keys`` records (``record_bytes`` each, key + value up to
  ``record_bytes - 16``; a key over 64 bytes is held as a 33-byte digest) that store ops
  (:class:`~floodwall.stores.Op`, e.g. every rate-limit algorithm's one pure step) read and
  write under the lock, exactly as the memory store runs them under its thread lock.

**Keys.** ``key = blake2b(uid, NAME, role)`` folded to 31 bits (role ``sem`` or ``shm``), so
two applications (two NAMEs) or two users on one host never meet; the segment's header also
holds a 128-bit digest of ``uid`` and ``NAME``, checked on attach (a foreign segment at the
same 31-bit key is refused, never written). Both objects are created ``0600``: only the user
who runs the processes can open them. NAME: letters, digits, ``.``, ``_``, ``-``, at most 64.

**Crashes.** Records are written under the lock with a CRC32; one torn by a process killed
mid-write reads as absent (the limit kept there starts over, once), never as garbage. Every
wait is bounded: the lock by ``timeout`` (a holder that is *stopped*, SIGSTOP, makes callers
give up with :class:`~floodwall.stores.StoreTimeoutError`, which store guards take as an
outage), a slot by the bulkhead's ``max_wait``.

**Cleanup.** The last process to :meth:`HostStore.close` (or to exit normally: ``close`` runs at
interpreter exit) removes both objects. If it was killed instead, they stay, harmless and
reused by the next process (every slot came back through ``SEM_UNDO``); :func:`remove` (CLI:
``floodwall host remove NAME``) deletes them, refusing while a process still uses NAME.

**Bounds.** Memory is ``max_keys x record_bytes`` plus ``bulkheads x 96`` bytes, fixed when
NAME is first created (4 MiB by default); a new key arriving at a full probe window (16
records) evicts the one expiring first (:attr:`HostStore.evicted`). The layout is fixed for
the life of the objects: a process asking NAME for another layout, larger or smaller, cannot
use it (its ops raise :class:`~floodwall.stores.StoreUnavailableError` whose cause names NAME,
both layouts and the fix: ``floodwall host remove NAME`` once no process uses it, or a new
name; its policies' ``on_store_error`` answers, never an error per call).

Linux only (``semtimedop``); ops on a store cost two system calls (lock, unlock) plus the step.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import hashlib
import math
import os
import re
import struct
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from floodwall._core import defaults
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError
from floodwall._core.validate import count
from floodwall.stores import _sysv
from floodwall.stores._sysv import GETNCNT, GETVAL, IPC_NOWAIT, SEM_UNDO, SETVAL, Lib, Ops
from floodwall.stores.base import (
    KEEP,
    Arg,
    Op,
    R,
    Record,
    Store,
    StoreClosedError,
    StoreRecordTooLargeError,
    StoreTimeoutError,
    StoreUnavailableError,
)

__all__ = ["HostInfo", "HostSlots", "HostStore", "info", "keys_of", "remove"]

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_MODE = 0o600
_MAGIC = b"FLDWHST1"
_VERSION = 1
_HEADER = struct.Struct(
    "<8sIIII16sQ"
)  # magic, version, max_keys, record_bytes, bulkheads, id, evicted
_HEADER_SIZE = 64
_ENTRY = struct.Struct("<I16sI64s")  # crc, digest of the bulkhead's name, size, name
_ENTRY_SIZE = 96
_RECORD = struct.Struct("<IdHH")  # crc, expires_at (inf: never), key length, value length
_TAG = struct.Struct("<Q")
_WINDOW = 16
"""Records a key may live in (a probe window): lookups read 16 tags, no more."""
_FIRST_SLOT = 2
_KEY_MAX = 64
"""Keys longer than this many bytes are held as a digest (``0xff`` and 32 bytes of blake2b,
never valid UTF-8, so never a short key's bytes): a caller's long key (a header, a URL) fits a
record like any other, instead of failing as a store error that takes the store down for
every key."""
_POLL_MIN, _POLL_MAX = 0.0005, 0.005
"""Seconds between two tries of an async caller waiting for the lock (never blocks the loop)."""

_LOCK = Ops([(0, 0, 0), (0, 1, SEM_UNDO)])
_LOCK_NOW = Ops([(0, 0, IPC_NOWAIT), (0, 1, SEM_UNDO | IPC_NOWAIT)])
_UNLOCK = Ops([(0, -1, SEM_UNDO | IPC_NOWAIT)])
_JOIN = Ops([(1, 1, SEM_UNDO | IPC_NOWAIT)])
_LEAVE = Ops([(1, -1, SEM_UNDO | IPC_NOWAIT)])


def _name_of(url_or_name: str) -> str:
    name = urlsplit(url_or_name).netloc if "://" in url_or_name else url_or_name
    if not _NAME.match(name):
        raise ConfigError(
            f"host store name must be 1-64 letters, digits, '.', '_' or '-', got {name!r}"
        )
    return name


def _digest(name: str, role: str, size: int) -> bytes:
    data = f"{os.geteuid()}\0{name}\0{role}".encode()
    return hashlib.blake2b(data, digest_size=size, person=b"floodwall-host").digest()


def keys_of(name: str) -> tuple[int, int]:
    """The System V keys of NAME for this user: ``(semaphore set, shared memory)``, as
    ``ipcs`` shows them (hex)."""
    name = _name_of(name)
    keys = []
    for role in ("sem", "shm"):
        key = int.from_bytes(_digest(name, role, 4), "little") & 0x7FFFFFFF
        keys.append(key or 1)  # 0 is IPC_PRIVATE
    return keys[0], keys[1]


def _held_key(full: str) -> bytes:
    """The bytes a record holds for the full key ``full`` (a digest when it is long)."""
    encoded = full.encode()
    if len(encoded) <= _KEY_MAX:
        return encoded
    return b"\xff" + hashlib.blake2b(encoded, digest_size=32).digest()


def _wrap(url: str, what: str, exc: OSError) -> StoreUnavailableError:
    error = (
        StoreClosedError(url, what)
        if exc.errno in (errno.EIDRM, errno.EINVAL)
        else StoreUnavailableError(url, what)
    )
    error.__cause__ = exc
    return error


@dataclass(frozen=True)
class _Layout:
    max_keys: int
    record_bytes: int
    bulkheads: int

    @property
    def tags(self) -> int:
        return _HEADER_SIZE + self.bulkheads * _ENTRY_SIZE

    @property
    def records(self) -> int:
        return self.tags + self.max_keys * 8

    @property
    def size(self) -> int:
        return self.records + self.max_keys * self.record_bytes

    def __str__(self) -> str:
        return (
            f"max_keys={self.max_keys}, record_bytes={self.record_bytes}, "
            f"bulkheads={self.bulkheads}"
        )


class HostStore(Store):
    """Records and host bulkhead slots shared by the processes of one host
    (``host://NAME``; see :mod:`floodwall.stores.host`).

    Options (also as URL query parameters, ``host://app?max_keys=8192``): ``max_keys``
    (default 4096), ``record_bytes`` (1024), ``bulkheads`` (64), ``timeout`` (seconds to wait for
    the lock, 0.5), ``prefix``, ``clock`` (must read a clock every process of the host shares:
    the default ``monotonic`` is; a :class:`~floodwall.FakeClock` only for one-process tests).
    Nothing is opened until the first operation.
    """

    timeout: float

    def __init__(
        self,
        url: str = "host://floodwall",
        *,
        prefix: str = defaults.STORE_PREFIX,
        timeout: float = defaults.STORE_HOST_TIMEOUT,
        max_keys: int = defaults.STORE_HOST_MAX_KEYS,
        record_bytes: int = defaults.STORE_HOST_RECORD_BYTES,
        bulkheads: int = defaults.STORE_HOST_BULKHEADS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(url, prefix=prefix)
        parts = urlsplit(url)
        if parts.scheme.lower() != "host" or parts.path not in ("", "/"):
            raise ConfigError(f"host store url must be host://NAME, got {url!r}")
        self.name = _name_of(url)
        query = dict(parse_qsl(parts.query))
        unknown = set(query) - {"max_keys", "record_bytes", "bulkheads", "timeout"}
        if unknown:
            raise ConfigError(f"host store url has unknown options {sorted(unknown)}: {url!r}")
        try:
            max_keys = int(query.get("max_keys", max_keys))
            record_bytes = int(query.get("record_bytes", record_bytes))
            bulkheads = int(query.get("bulkheads", bulkheads))
            timeout = float(query.get("timeout", timeout))
        except ValueError as exc:
            raise ConfigError(f"host store url options must be numbers: {url!r} ({exc})") from None
        self.layout = _Layout(
            count("max_keys", max_keys, 1),
            count("record_bytes", record_bytes, 64),
            count("bulkheads", bulkheads, 1),
        )
        if record_bytes > 65535:
            raise ConfigError(f"record_bytes must be <= 65535, got {record_bytes}")
        if not (isinstance(timeout, int | float) and 0 < timeout < math.inf):
            raise ConfigError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.clock = clock
        self.sem_key, self.shm_key = keys_of(self.name)
        self._identity = _digest(self.name, "identity", 16)
        self._window = min(_WINDOW, self.layout.max_keys)
        self._mutex = threading.Lock()
        self._lib: Lib | None = None
        self.semid = -1
        """The semaphore set's id while attached (``ipcs -s``), else -1."""
        self._shmid = -1
        self._address = 0
        self._view: memoryview | None = None
        self._joined = False
        self._closed = False
        self._slots: dict[str, HostSlots] = {}

    # -- attaching ----------------------------------------------------------------------------

    def _attach(self) -> memoryview:
        """The segment, attached and this process counted as a user (once; again after a
        fork, or after the objects were removed under it)."""
        view = self._view
        if view is not None and self._joined:
            return view
        with self._mutex:
            if self._closed:
                raise StoreClosedError(self.url, "attach")
            if self._view is None or not self._joined:
                self._open()
            assert self._view is not None
            return self._view

    def _open(self) -> None:
        try:
            lib = self._lib = self._lib or _sysv.libc()
        except OSError as exc:
            raise _wrap(self.url, "attach", exc) from None
        for attempt in range(3):
            try:
                if self._view is None:
                    self.semid = lib.sem_open(
                        self.sem_key, _FIRST_SLOT + self.layout.bulkheads, _MODE
                    )
                self._lock_blocking("attach")
                try:
                    if self._view is None:
                        self._shmid = lib.shm_open(self.shm_key, self.layout.size, _MODE)
                        self._address, self._view = lib.shm_attach(self._shmid, self.layout.size)
                    self._check_header(self._view)
                    lib.semop_timed(self.semid, _JOIN, None)
                    self._joined = True
                    _OPEN.add(self)
                finally:
                    self._unlock()
                return
            except StoreUnavailableError:
                raise
            except ConfigError as exc:  # another layout, a foreign segment: this process
                error = StoreUnavailableError(self.url, "attach")  # cannot use it; its
                error.__cause__ = exc  # policies' on_store_error decides, as for any outage
                raise error from exc
            except OSError as exc:
                self._forget()
                mismatch = self._mismatch() if exc.errno == errno.EINVAL else None
                if mismatch is not None:  # a larger layout than NAME's: semget/shmget say EINVAL
                    error = StoreUnavailableError(self.url, "attach")
                    raise error from mismatch
                if exc.errno in (errno.EIDRM, errno.EINVAL) and attempt < 2:
                    continue  # removed between our lookup and our lock: make them anew
                raise _wrap(self.url, "attach", exc) from None

    def _forget(self) -> None:
        """Drop the attachment (the objects were removed, or never fully opened)."""
        if self._view is not None:
            self._view.release()
            self._view = None
            if self._lib is not None:
                with contextlib.suppress(OSError):  # nothing mapped any more
                    self._lib.shm_detach(self._address)
        self._joined = False
        self.semid = self._shmid = -1
        self._slots.clear()

    def _check_header(self, view: memoryview) -> None:
        magic, version, keys, record, bulkheads, identity, _ = _HEADER.unpack_from(view, 0)
        layout = self.layout
        if magic != _MAGIC:  # a new segment (zero-filled), or one whose creator died in here
            view[: layout.records] = bytes(layout.records)  # header, directory, tags
            fields = (_VERSION, layout.max_keys, layout.record_bytes, layout.bulkheads)
            _HEADER.pack_into(view, 0, b"\0" * 8, *fields, self._identity, 0)
            view[0:8] = _MAGIC  # last: the header is whole before anyone trusts it
            return
        if identity != self._identity or version != _VERSION:
            raise ConfigError(
                f"the shared memory at key {self.shm_key:#010x} is not {self.url}'s "
                "(another program's, or another floodwall version's); remove it with ipcrm"
            )
        existing = _Layout(keys, record, bulkheads)
        if existing != layout:
            raise self._layout_error(str(existing))

    def _layout_error(self, existing: str) -> ConfigError:
        """The error for NAME existing with another layout than this store asks for."""
        name = self.name
        return ConfigError(
            f"host store {name!r} exists with {existing}; this store asks for {self.layout} "
            f"(the layout is fixed while the objects exist): run `floodwall host remove {name}` "
            "once no process uses it (the next one creates it with the new layout), or use a "
            f"new name (host://{name}-2?...)"
        )

    def _mismatch(self) -> ConfigError | None:
        """After ``EINVAL`` from ``semget``/``shmget``: the layout error when NAME's objects
        exist smaller than this store's layout (read from the segment's header), else ``None``
        (they were removed under us: try again)."""
        lib = self._lib
        assert lib is not None
        try:
            shmid = lib.shm_find(self.shm_key)
            if shmid is None:
                semid = lib.sem_find(self.sem_key)
                return None if semid is None else self._layout_error("fewer bulkhead slots")
            address, view = lib.shm_attach(shmid, _HEADER_SIZE)
            try:
                magic, version, keys, record, bulkheads, identity, _ = _HEADER.unpack_from(view)
            finally:
                view.release()
                lib.shm_detach(address)
        except OSError:
            return None
        if magic != _MAGIC or identity != self._identity or version != _VERSION:
            return None
        existing = _Layout(keys, record, bulkheads)
        return None if existing == self.layout else self._layout_error(str(existing))

    # -- the lock -----------------------------------------------------------------------------

    def _lock_blocking(self, what: str) -> None:
        assert self._lib is not None
        if not self._lib.semop_timed(self.semid, _LOCK, self.timeout):
            error = StoreTimeoutError(self.url, what)
            error.__cause__ = TimeoutError(
                f"the lock of {self.url} was held for more than {self.timeout:g}s "
                "(a process stopped while holding it?)"
            )
            raise error

    async def _lock_async(self, what: str) -> None:
        assert self._lib is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + self.timeout
        pause = _POLL_MIN
        while not self._lib.semop_timed(self.semid, _LOCK_NOW, None):
            if loop.time() >= end:
                raise StoreTimeoutError(self.url, what)
            await asyncio.sleep(pause)
            pause = min(_POLL_MAX, pause * 2)

    def _unlock(self) -> None:
        assert self._lib is not None
        self._lib.semop_timed(self.semid, _UNLOCK, None)

    # -- ops ----------------------------------------------------------------------------------

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        keys = self.keys(op, key)
        view = self._attach()
        try:
            self._lock_blocking(op.script)
            try:
                return self._step(view, op, keys, args)
            finally:
                self._unlock()
        except OSError as exc:
            raise self._lost(op.script, exc) from None

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        keys = self.keys(op, key)
        view = self._view
        if view is None or not self._joined:  # attaching takes the lock: wait off the loop
            view = await asyncio.to_thread(self._attach)
        try:
            await self._lock_async(op.script)
            try:
                return self._step(view, op, keys, args)
            finally:
                self._unlock()
        except OSError as exc:
            raise self._lost(op.script, exc) from None

    def _lost(self, what: str, exc: OSError) -> StoreUnavailableError:
        """An IPC call failed: wrap it; if the objects were removed, re-open at the next op."""
        if exc.errno in (errno.EIDRM, errno.EINVAL):
            with self._mutex:
                self._forget()
        return _wrap(self.url, what, exc)

    def _step(self, view: memoryview, op: Op[R], keys: list[str], args: Sequence[Arg]) -> R:
        now = self.clock.monotonic()
        held = [_held_key(full) for full in keys]
        found = [self._find(view, full, now) for full in held]
        records = [record for _, _, record in found]
        writes, result = op.step(records, now, args)
        for (slot, tag, _), full, write in zip(found, held, writes, strict=True):
            if write is KEEP:
                continue
            if write is None:
                self._clear(view, slot)
                continue
            assert isinstance(write, Record)
            self._write(view, (slot, tag), full, write, now)
        return result

    # -- the record table ---------------------------------------------------------------------

    def _start(self, tag: int) -> int:
        return tag % (self.layout.max_keys - self._window + 1)

    def _read(self, view: memoryview, slot: int, full: bytes) -> tuple[float, bytes] | None:
        """The record in ``slot`` if it is ``full``'s and whole (CRC), else ``None``."""
        off = self.layout.records + slot * self.layout.record_bytes
        crc, expires, klen, vlen = _RECORD.unpack_from(view, off)
        if klen != len(full) or 16 + klen + vlen > self.layout.record_bytes:
            return None
        body = view[off + 4 : off + 16 + klen + vlen]
        if zlib.crc32(body) != crc or body[12 : 12 + klen] != full:
            return None
        return expires, bytes(body[12 + klen :])

    def _find(self, view: memoryview, full: bytes, now: float) -> tuple[int, int, Record | None]:
        """``(slot, tag, record)``: the slot holding ``full`` (-1: none) and its live record."""
        tag = int.from_bytes(hashlib.blake2b(full, digest_size=8).digest(), "little") | 1
        start = self._start(tag)
        tags = struct.unpack_from(f"<{self._window}Q", view, self.layout.tags + start * 8)
        for i, held in enumerate(tags):
            if held == tag:
                read = self._read(view, start + i, full)
                if read is not None:
                    expires, value = read
                    if expires > now:
                        expiry = None if expires == math.inf else expires
                        return start + i, tag, Record(value, expiry)
                    return start + i, tag, None
        return -1, tag, None

    def _write(
        self, view: memoryview, place: tuple[int, int], full: bytes, record: Record, now: float
    ) -> None:
        """Write ``record`` for ``full`` in its slot (``place``: the slot, -1 for a new
        one, and the key's tag); the CRC before the tag, so a half-written record is never
        found whole."""
        slot, tag = place
        room = self.layout.record_bytes - 16
        if len(full) + len(record.value) > room:
            error = StoreRecordTooLargeError(self.url, "write")
            error.__cause__ = ValueError(
                f"{self.url} holds at most {room} bytes of key and value per record "
                f"(record_bytes={self.layout.record_bytes}), got {len(full) + len(record.value)}"
            )
            raise error
        if slot < 0:
            slot = self._room(view, tag, now)
        expires = math.inf if record.expires_at is None else record.expires_at
        body = _RECORD.pack(0, expires, len(full), len(record.value))[4:] + full + record.value
        off = self.layout.records + slot * self.layout.record_bytes
        view[off : off + 4 + len(body)] = struct.pack("<I", zlib.crc32(body)) + body
        _TAG.pack_into(view, self.layout.tags + slot * 8, tag)

    def _room(self, view: memoryview, tag: int, now: float) -> int:
        """A slot of ``tag``'s window for a new record: a free or expired one, else the one
        that expires first (counted in :attr:`evicted`)."""
        start = self._start(tag)
        layout = self.layout
        tags = struct.unpack_from(f"<{self._window}Q", view, layout.tags + start * 8)
        first, soonest = -1, math.inf
        for i, held in enumerate(tags):
            if held == 0:
                return start + i
            expires = struct.unpack_from(
                "<d", view, layout.records + (start + i) * layout.record_bytes + 4
            )[0]
            if not expires > now:  # expired (or torn: NaN)
                return start + i
            if expires < soonest or first < 0:
                first, soonest = start + i, expires
        self._count_eviction(view)
        return first

    def _count_eviction(self, view: memoryview) -> None:
        offset = _HEADER.size - 8
        (evicted,) = struct.unpack_from("<Q", view, offset)
        struct.pack_into("<Q", view, offset, evicted + 1)

    def _clear(self, view: memoryview, slot: int) -> None:
        if slot >= 0:
            _TAG.pack_into(view, self.layout.tags + slot * 8, 0)

    @property
    def evicted(self) -> int:
        """Live records dropped to make room for a new key, by every process (0: enough)."""
        view = self._attach()
        return int(struct.unpack_from("<Q", view, _HEADER.size - 8)[0])

    # -- host bulkhead slots ------------------------------------------------------------------

    def slots(self, name: str, size: int) -> HostSlots:
        """The host-wide slots of the bulkhead ``name`` (``size`` of them): made by the first
        process that asks, shared by every later one. A process asking for another size is
        refused (:class:`ConfigError`): the size is fixed while any process uses NAME."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"bulkhead name must be a non-empty string, got {name!r}")
        count("max_concurrent", size, 1)
        if size > 32767:
            raise ConfigError(f"max_concurrent must be <= 32767 (SEMVMX) on host://, got {size}")
        held = self._slots.get(name)
        if held is not None and held.semid == self.semid and self._joined:
            if held.size != size:
                raise self._resized(name, held.size, size)
            return held
        view = self._attach()
        try:
            self._lock_blocking("bulkhead")
            try:
                index, found = self._entry(view, name, size)
            finally:
                self._unlock()
        except OSError as exc:
            raise self._lost("bulkhead", exc) from None
        if found != size:
            raise self._resized(name, found, size)
        held = self._slots[name] = HostSlots(self, name, _FIRST_SLOT + index, size)
        return held

    def check_size(self, name: str, size: int) -> None:
        """Raise :class:`ConfigError` if this process already uses bulkhead ``name`` with
        another size (what a reload asking for a new size would run into)."""
        held = self._slots.get(name)
        if held is not None and held.size != size:
            raise self._resized(name, held.size, size)

    def _resized(self, name: str, held: int, size: int) -> ConfigError:
        return ConfigError(
            f"host bulkhead {name!r} on {self.url} has max_concurrent={held} while processes use "
            f"it; got max_concurrent={size} (use another bulkhead name, or restart every worker)"
        )

    def _entry(self, view: memoryview, name: str, size: int) -> tuple[int, int]:
        """The directory index of bulkhead ``name`` and its size (lock held): an existing
        entry, or a new one whose semaphore is set to ``size`` before the entry is written."""
        digest = hashlib.blake2b(name.encode(), digest_size=16).digest()
        free = -1
        for index in range(self.layout.bulkheads):
            entry = self._entry_at(view, index)
            if entry is None:
                free = index if free < 0 else free
            elif entry[0] == digest:
                return index, entry[1]
        if free < 0:
            raise ConfigError(
                f"{self.url} holds {self.layout.bulkheads} host bulkheads, all in use; "
                f"raise bulkheads= (host://{self.name}?bulkheads=N) for {name!r}"
            )
        assert self._lib is not None
        self._lib.semctl(self.semid, _FIRST_SLOT + free, SETVAL, size)
        body = _ENTRY.pack(0, digest, size, name.encode()[:64])[4:]
        off = _HEADER_SIZE + free * _ENTRY_SIZE
        view[off : off + _ENTRY.size] = struct.pack("<I", zlib.crc32(body)) + body
        return free, size

    @staticmethod
    def _entry_at(view: memoryview, index: int) -> tuple[bytes, int, str] | None:
        off = _HEADER_SIZE + index * _ENTRY_SIZE
        crc, digest, size, name = _ENTRY.unpack_from(view, off)
        if size == 0 or zlib.crc32(view[off + 4 : off + _ENTRY.size]) != crc:
            return None
        return digest, size, name.rstrip(b"\0").decode(errors="replace")

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop using NAME: the last process to close removes the semaphore set and the
        segment (``ipcs`` shows neither); calls after this raise :class:`StoreClosedError`."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            _OPEN.discard(self)
            if not self._joined or self._lib is None:
                self._forget()
                return
            lib = self._lib
            try:
                self._lock_blocking("close")
            except (StoreUnavailableError, OSError):
                self._forget()
                return  # removed under us, or a stopped holder: leave, never wait longer
            semid, shmid = self.semid, self._shmid
            last = False
            with contextlib.suppress(OSError):  # removed under us: nothing left to remove
                lib.semop_timed(semid, _LEAVE, None)
                last = lib.semctl(semid, 1, GETVAL) == 0
            self._forget()
            with contextlib.suppress(OSError):
                if last:
                    lib.shm_remove(shmid)  # freed once no process maps it any more
                    lib.sem_remove(semid)  # the lock goes with the set
                else:
                    lib.semop_timed(semid, _UNLOCK, None)

    def __enter__(self) -> HostStore:
        return self

    def _after_fork(self) -> None:
        """In a forked child: the mapping is inherited, the count of users is not."""
        self._mutex = threading.Lock()
        self._joined = False

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "semaphore_key": f"{self.sem_key:#010x}",
            "shared_memory_key": f"{self.shm_key:#010x}",
            "max_keys": self.layout.max_keys,
            "record_bytes": self.layout.record_bytes,
            "bulkheads": self.layout.bulkheads,
            "bytes": self.layout.size,
        }


class HostSlots:
    """The slots of one host bulkhead: a semaphore whose value is the free slots.

    :meth:`take` and :meth:`give` are one ``semop`` each (with ``SEM_UNDO``: the kernel gives
    a dead process's slots back); :meth:`wait` sleeps in the kernel (``semtimedop``), bounded.
    """

    __slots__ = (
        "_give",
        "_lib",
        "_semop",
        "_take",
        "_wait",
        "index",
        "name",
        "semid",
        "size",
        "store",
    )

    def __init__(self, store: HostStore, name: str, index: int, size: int) -> None:
        assert store._lib is not None
        self.store = store
        self.name = name
        self.index = index
        self.size = size
        self.semid = store.semid
        self._lib = store._lib
        self._semop = store._lib.semop
        self._take = Ops([(index, -1, SEM_UNDO | IPC_NOWAIT)])
        self._wait = Ops([(index, -1, SEM_UNDO)])
        self._give = Ops([(index, 1, SEM_UNDO | IPC_NOWAIT)])

    def take(self) -> bool:
        """Take a free slot now (True), or find none (False): one ``semop``."""
        if self.store._joined and self._semop(self.semid, self._take.ref, 1) == 0:
            return True
        self.store._attach()  # a forked child: count it as a user of NAME first
        try:
            return self._lib.semop_timed(self.semid, self._take, None)
        except OSError as exc:
            raise self.store._lost("bulkhead", exc) from None

    def wait(self, timeout: float) -> bool:
        """Take a slot, sleeping in the kernel at most ``timeout`` seconds for one."""
        try:
            return self._lib.semop_timed(self.semid, self._wait, max(0.0, timeout))
        except OSError as exc:
            raise self.store._lost("bulkhead", exc) from None

    def give(self) -> None:
        """Give a slot back: one ``semop``."""
        if self._semop(self.semid, self._give.ref, 1) != 0:
            try:
                self._lib.semop_timed(self.semid, self._give, None)
            except OSError as exc:
                raise self.store._lost("bulkhead", exc) from None

    @property
    def free(self) -> int:
        """Free slots now, host-wide."""
        try:
            return self._lib.semctl(self.semid, self.index, GETVAL)
        except OSError as exc:
            raise self.store._lost("bulkhead", exc) from None

    @property
    def waiting(self) -> int:
        """Threads of the host sleeping in :meth:`wait` now."""
        try:
            return self._lib.semctl(self.semid, self.index, GETNCNT)
        except OSError as exc:
            raise self.store._lost("bulkhead", exc) from None


@dataclass(frozen=True)
class HostInfo:
    """What :func:`info` finds for a NAME: the keys, whether each object exists, how many
    processes use it, and its host bulkheads as ``(name, size, free)``."""

    name: str
    semaphore_key: int
    shared_memory_key: int
    semaphores: bool
    shared_memory: bool
    users: int
    bulkheads: tuple[tuple[str, int, int], ...]


def info(name: str) -> HostInfo:
    """The IPC objects of ``host://name`` for this user, read without changing them."""
    name = _name_of(name)
    lib = _sysv.libc()
    sem_key, shm_key = keys_of(name)
    semid = lib.sem_find(sem_key)
    shmid = lib.shm_find(shm_key)
    users = 0 if semid is None else lib.semctl(semid, 1, GETVAL)
    bulkheads: list[tuple[str, int, int]] = []
    if semid is not None and shmid is not None:
        address, view = lib.shm_attach(shmid, _HEADER_SIZE)
        try:
            declared = _HEADER.unpack_from(view, 0)[4]
        finally:
            view.release()
            lib.shm_detach(address)
        address, view = lib.shm_attach(shmid, _HEADER_SIZE + declared * _ENTRY_SIZE)
        try:
            for index in range(declared):
                entry = HostStore._entry_at(view, index)
                if entry is not None:
                    free = lib.semctl(semid, _FIRST_SLOT + index, GETVAL)
                    bulkheads.append((entry[2], entry[1], free))
        finally:
            view.release()
            lib.shm_detach(address)
    return HostInfo(
        name, sem_key, shm_key, semid is not None, shmid is not None, users, tuple(bulkheads)
    )


def remove(name: str, *, force: bool = False) -> bool:
    """Remove ``host://name``'s semaphore set and segment (stale ones a killed last process
    left); False when there was nothing to remove. Refused (:class:`ConfigError`) while a
    process uses NAME, unless ``force`` (its calls then fail as a store outage)."""
    name = _name_of(name)
    lib = _sysv.libc()
    sem_key, shm_key = keys_of(name)
    semid = lib.sem_find(sem_key)
    shmid = lib.shm_find(shm_key)
    if semid is not None and not force:
        users = lib.semctl(semid, 1, GETVAL)
        if users:
            raise ConfigError(
                f"host://{name} is in use by {users} process(es); stop them first, "
                "or remove with force=True (their calls then fail as a store outage)"
            )
    if shmid is not None:
        lib.shm_remove(shmid)
    if semid is not None:
        lib.sem_remove(semid)
    return semid is not None or shmid is not None


_OPEN: set[HostStore] = set()
"""Every store of this process that joined its NAME and is not closed yet: closed at exit (so
the last process to leave removes the objects), re-joined after a fork. Held strongly: a store
dropped without ``close()`` still leaves at exit."""


def _close_all() -> None:
    for store in list(_OPEN):
        store.close()


def _forked() -> None:
    for store in list(_OPEN):
        store._after_fork()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forked)
