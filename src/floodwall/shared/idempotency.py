"""Idempotency: run a write once per key, replay its result to every repeat.

``Idempotency(store)`` wraps a call (decorator, ``call``/``call_async``, or a step of a
:class:`~floodwall.Pipeline`). The key comes from ``key(*args, **kwargs)`` or, by default, from
the ambient :func:`floodwall.idempotency_key` (what a ``Retry`` declared ``idempotent=False``
requires, and what integrations fill from an ``Idempotency-Key`` header). Without a key the call
runs unprotected, or is refused with :class:`IdempotencyKeyMissingError` when ``required=True``.

Semantics, as in the payment APIs that made the pattern common:

* the first request with a key claims it (an **in-progress** record with an owner token and the
  request's fingerprint, expiring after ``lock_ttl``), runs, and stores its result (a **done**
  record, kept ``ttl`` seconds: the guarantee period, 24 h by default);
* a repeat after it finished gets the stored result, decoded by ``codec`` (JSON by default),
  without running anything (``replays`` counts them);
* a concurrent repeat while the first runs gets :class:`DuplicateInFlightError` (HTTP 409,
  ``retry_after`` = seconds until the claim would lapse);
* a key reused with a different fingerprint (``fingerprint(*args, **kwargs)``, e.g.
  :func:`fingerprint_of`) gets :class:`IdempotencyKeyReusedError` (HTTP 422), in progress or
  done;
* a call that raises releases its claim, so a retry runs again (failures are not stored: the
  key means "this write", and a failed write did not happen);
* a crashed owner's claim lapses after ``lock_ttl``; then the key can run again. So ``lock_ttl``
  must exceed the longest the call can take (its timeout): a call still running when its claim
  lapses may run twice, and its result then is not stored (``lock_lost`` counts it).

Atomicity comes from the store: one op per step (claim, store result, release), each atomic on
every backend (a Lua script on Redis, one transaction on the dedupe table
``floodwall_idempotency`` whose primary key is the unique index on SQL).

When the store is down (``on_store_error``): ``"fail_closed"`` (default) refuses with
:class:`IdempotencyUnavailableError` (HTTP 503; no write runs that could not be deduplicated);
``"fail_open"`` runs the call unprotected; ``"local"`` deduplicates in this process only. If
the store fails after the call ran, the caller still gets its result; the claim stays until
``lock_ttl`` (repeats get 409 until then, then run again).

:class:`OneTimeTokens` is the token scheme: issue a token with a form or a checkout page,
consume it atomically on the first submit; every later submit with it is refused.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal, ParamSpec, Protocol, TypeVar

from floodwall._core import defaults, validate
from floodwall._core.admission import Flow
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, RejectedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.options import Checks, check_all, optional
from floodwall._core.steps import CALL, Apply, FlowSteps, Step
from floodwall.breaker import CircuitBreaker
from floodwall.context import current_idempotency_key
from floodwall.stores import resolve
from floodwall.stores.base import KEEP, Op, Record, Store, Write
from floodwall.stores.guard import Guarded, StoreErrorMode, StoreGuard, check_mode, mode_field

__all__ = [
    "JSON_CODEC",
    "Codec",
    "DuplicateInFlightError",
    "Idempotency",
    "IdempotencyKeyMissingError",
    "IdempotencyKeyReusedError",
    "IdempotencyOptions",
    "IdempotencyRecord",
    "IdempotencyTokenError",
    "IdempotencyUnavailableError",
    "JsonCodec",
    "OneTimeTokens",
    "fingerprint_of",
]

P = ParamSpec("P")
T = TypeVar("T")


# -- errors -----------------------------------------------------------------------------------


class DuplicateInFlightError(RejectedError):
    """The same key is being processed right now: ``DuplicateInFlightError(name, reason,
    retry_after)`` (HTTP 409 Conflict)."""

    kind = "duplicate_in_flight"


class IdempotencyKeyReusedError(RejectedError):
    """The key was used before for a different request (another fingerprint):
    ``IdempotencyKeyReusedError(name, reason)`` (HTTP 422)."""

    kind = "idempotency_key_reused"


class IdempotencyKeyMissingError(RejectedError):
    """``required=True`` and the call carries no idempotency key (HTTP 400)."""

    kind = "idempotency_key_missing"


class IdempotencyUnavailableError(RejectedError):
    """The idempotency store is down and ``on_store_error="fail_closed"`` (HTTP 503); the
    :class:`~floodwall.stores.StoreUnavailableError` is the ``__cause__``."""

    kind = "idempotency_unavailable"


class IdempotencyTokenError(RejectedError):
    """A one-time token is unknown, expired or already used (HTTP 409)."""

    kind = "idempotency_token_used"


# -- codecs and fingerprints -----------------------------------------------------------------


class Codec(Protocol):
    """How results are stored: ``dumps(value) -> bytes`` and ``loads(bytes) -> value``."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JsonCodec:
    """Results as compact JSON (UTF-8): dicts, lists, strings, numbers, booleans, ``None``."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


JSON_CODEC = JsonCodec()


def fingerprint_of(*args: Any, **kwargs: Any) -> str:
    """A fingerprint of a request's arguments: SHA-256 of their canonical JSON (``repr`` for
    what JSON cannot express). Pass as ``fingerprint=fingerprint_of``."""
    text = json.dumps([args, kwargs], sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# -- the ops ----------------------------------------------------------------------------------

_IN_PROGRESS = "p"
_DONE = "d"


def _pack(state: str, owner: str, fingerprint: str, result: bytes = b"") -> bytes:
    head = json.dumps({"s": state, "o": owner, "f": fingerprint}, separators=(",", ":"))
    return head.encode() + b"\n" + result


def _unpack(value: bytes) -> tuple[str, str, str, bytes]:
    head, _, result = value.partition(b"\n")
    fields = json.loads(head)
    return fields["s"], fields["o"], fields["f"], result


def _ms_left(record: Record, now: float) -> int:
    return 0 if record.expires_at is None else max(0, round((record.expires_at - now) * 1000))


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


Begin = tuple[str, int, bytes | None]
"""``(status, ms_left, result)``: status is started | in_flight | done | mismatch."""


class BeginOp(Op[Begin]):
    """Claim a key: args ``(owner, fingerprint, lock_ms)``."""

    script = "idempotency_begin"
    table = "idempotency"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], Begin]:
        owner, fingerprint, lock_ms = str(args[0]), str(args[1]), int(args[2])
        record = records[0]
        if record is None:
            claim = Record(_pack(_IN_PROGRESS, owner, fingerprint), now + lock_ms / 1000)
            return [claim], ("started", lock_ms, None)
        state, holder, stored_fingerprint, result = _unpack(record.value)
        left = _ms_left(record, now)
        if stored_fingerprint != fingerprint:
            return [KEEP], ("mismatch", left, None)
        if state == _IN_PROGRESS:
            return [KEEP], ("started" if holder == owner else "in_flight", left, None)
        return [KEEP], ("done", left, result)

    def parse(self, raw: Any) -> Begin:
        result = bytes(raw[2]) if len(raw) > 2 else None
        return _text(raw[0]), int(raw[1]), result


class CompleteOp(Op[str]):
    """Store a result: args ``(owner, fingerprint, result, ttl_ms)`` → stored | stored_late |
    conflict."""

    script = "idempotency_complete"
    table = "idempotency"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], str]:
        owner, fingerprint, result, ttl_ms = str(args[0]), str(args[1]), args[2], int(args[3])
        record = records[0]
        status = "stored_late"
        if record is not None:
            state, holder, _, _ = _unpack(record.value)
            if holder != owner:
                return [KEEP], "conflict"
            if state == _DONE:
                return [KEEP], "stored"
            status = "stored"
        done = Record(_pack(_DONE, owner, fingerprint, bytes(result)), now + ttl_ms / 1000)
        return [done], status

    def parse(self, raw: Any) -> str:
        return _text(raw)


class ReleaseOp(Op[bool]):
    """Give up a claim: args ``(owner,)`` → whether it was this owner's."""

    script = "idempotency_release"
    table = "idempotency"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], bool]:
        record = records[0]
        if record is not None:
            state, holder, _, _ = _unpack(record.value)
            if state == _IN_PROGRESS and holder == str(args[0]):
                return [None], True
        return [KEEP], False

    def parse(self, raw: Any) -> bool:
        return bool(raw)


Peek = tuple[str, str, bytes, int] | None


class GetOp(Op[Peek]):
    """Read a record: → ``(state, fingerprint, result, ms_left)`` or ``None``."""

    script = "idempotency_get"
    table = "idempotency"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], Peek]:
        record = records[0]
        if record is None:
            return [KEEP], None
        state, _, fingerprint, result = _unpack(record.value)
        return [KEEP], (state, fingerprint, result, _ms_left(record, now))

    def parse(self, raw: Any) -> Peek:
        if not raw:
            return None
        return _text(raw[0]), _text(raw[1]), bytes(raw[2]), int(raw[3])


class TokenIssueOp(Op[bool]):
    """Issue a one-time token: args ``(ttl_ms,)``."""

    script = "token_issue"
    table = "idempotency"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], bool]:
        return [Record(b"1", now + int(args[0]) / 1000)], True

    def parse(self, raw: Any) -> bool:
        return bool(raw)


class TokenConsumeOp(Op[bool]):
    """Consume a one-time token: args ``(consumer,)`` → True for its first consumer only."""

    script = "token_consume"
    table = "idempotency"

    def step(
        self, records: Sequence[Record | None], now: float, args: Sequence[Any]
    ) -> tuple[Sequence[Write], bool]:
        record = records[0]
        mark = b"c:" + str(args[0]).encode()
        if record is None:
            return [KEEP], False
        if record.value == b"1":
            return [Record(mark, record.expires_at)], True
        return [KEEP], record.value == mark

    def parse(self, raw: Any) -> bool:
        return bool(raw)


BEGIN = BeginOp()
COMPLETE = CompleteOp()
RELEASE = ReleaseOp()
GET = GetOp()
TOKEN_ISSUE = TokenIssueOp()
TOKEN_CONSUME = TokenConsumeOp()


# -- the policy -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """What the store holds for a key: ``state`` ("in_progress" or "done"), the request's
    ``fingerprint``, the decoded ``result`` (done only) and ``expires_in`` seconds."""

    state: Literal["in_progress", "done"]
    fingerprint: str
    result: Any
    expires_in: float


@dataclass(slots=True)
class _Claim:
    """One call's claim on a key; ``where`` is the store that holds it (``None``: unprotected)."""

    key: str
    public: str
    owner: str
    fingerprint: str
    where: Literal["store", "local"] | None = "store"


_RUN: Any = object()
"""``_on_begin`` result meaning "this call claimed the key: run it"."""


_ttl = partial(validate.seconds, minimum=0.001)


@dataclass(frozen=True, slots=True)
class IdempotencyOptions:
    """An :class:`Idempotency`'s options, validated once: ``ttl`` (seconds a finished call's
    result is replayed, 24 h), ``lock_ttl`` (seconds an in-flight claim blocks duplicates, 60 s,
    at most ``ttl``), ``key`` (a callable of the call's arguments; ``None``: the ambient
    :func:`~floodwall.idempotency_key`), ``fingerprint`` (a callable of the arguments: a key
    reused with other arguments is refused), ``codec``, ``required`` (refuse calls without a
    key) and ``on_store_error`` (``fail_closed``). The store and its breaker are what it is
    wired to, not options."""

    ttl: float = defaults.IDEMPOTENCY_TTL
    lock_ttl: float = defaults.IDEMPOTENCY_LOCK_TTL
    key: Callable[..., str | None] | None = None
    fingerprint: Callable[..., str | bytes] | None = None
    codec: Codec = JSON_CODEC
    required: bool = False
    on_store_error: StoreErrorMode = "fail_closed"

    CHECKS: ClassVar[Checks] = {
        "ttl": _ttl,
        "lock_ttl": _ttl,
        "key": optional(partial(validate.function, what="a callable of the call's arguments")),
        "fingerprint": optional(partial(validate.function, what="a callable of the arguments")),
        "codec": validate.codec,
        "required": validate.flag,
        "on_store_error": mode_field,
    }

    def __post_init__(self) -> None:
        check_all(self, self.CHECKS)
        if self.lock_ttl > self.ttl:
            raise ConfigError(f"lock_ttl must be <= ttl ({self.ttl:g}), got {self.lock_ttl:g}")


class Idempotency(Flow):
    """Run a call once per idempotency key and replay its result (see
    [Distributed state][guide-distributed])."""

    kind = "idempotency"

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        ttl: float = defaults.IDEMPOTENCY_TTL,
        lock_ttl: float = defaults.IDEMPOTENCY_LOCK_TTL,
        key: Callable[..., str | None] | None = None,
        fingerprint: Callable[..., str | bytes] | None = None,
        codec: Codec = JSON_CODEC,
        required: bool = False,
        name: str = "idempotency",
        on_store_error: StoreErrorMode = "fail_closed",
        breaker: CircuitBreaker | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.options = o = IdempotencyOptions(
            ttl, lock_ttl, key, fingerprint, codec, required, on_store_error
        )
        """The validated :class:`IdempotencyOptions`, read once, here."""
        self.ttl = o.ttl
        self.lock_ttl = o.lock_ttl
        self.key = o.key
        self.fingerprint = o.fingerprint
        self.codec = o.codec
        self.required = o.required
        self.name = validate.text("name", name)
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.store = resolve(store)
        self.store.expect_durable(name, self.listeners)  # a restart must not rerun done calls
        self.guard = StoreGuard(
            self.store,
            on_store_error=o.on_store_error,
            name=name,
            breaker=breaker,
            clock=clock,
            listeners=self.listeners,
        )
        self._ttl_ms = max(1, round(self.ttl * 1000))
        self._lock_ms = max(1, round(self.lock_ttl * 1000))
        self.executions = 0
        """Calls that claimed their key and ran."""
        self.replays = 0
        """Repeats answered with a stored result."""
        self.lock_lost = 0
        """Calls whose result could not be stored (claim lapsed and taken, or store down)."""

    # -- the decision core --------------------------------------------------------------------

    def _claim(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Claim | None:
        key = self.key(*args, **kwargs) if self.key is not None else current_idempotency_key()
        if key is None:
            if self.required:
                raise IdempotencyKeyMissingError(self.name, "the call carries no idempotency key")
            return None
        if not isinstance(key, str) or not key:
            raise ConfigError(f"the idempotency key must be a non-empty string, got {key!r}")
        fingerprint = ""
        if self.fingerprint is not None:
            raw = self.fingerprint(*args, **kwargs)
            fingerprint = hashlib.sha256(raw).hexdigest() if isinstance(raw, bytes) else str(raw)
        return _Claim(f"idem:{self.name}:{key}", key, secrets.token_hex(16), fingerprint)

    def _begin_args(self, claim: _Claim) -> list[str | int]:
        return [claim.owner, claim.fingerprint, self._lock_ms]

    def _on_begin(self, claim: _Claim, guarded: Guarded[Begin]) -> Any:
        """Decide from the claim's outcome: ``_RUN``, a replayed result, or raise."""
        down = guarded.down
        if down is not None:
            if down.mode == "fail_closed":
                raise IdempotencyUnavailableError(
                    self.name, "the idempotency store is unavailable", None
                ) from down.error
            if down.mode == "fail_open":
                claim.where = None
                self._emit("unprotected", "the store is unavailable: running without dedupe")
                self.executions += 1
                return _RUN
            claim.where = "local"
        assert guarded.value is not None
        status, ms_left, result = guarded.value
        if status == "started":
            self.executions += 1
            return _RUN
        if status == "done":
            self.replays += 1
            return self.codec.loads(result or b"")
        public = claim.public
        if status == "in_flight":
            raise DuplicateInFlightError(
                self.name, f"a request with key {public!r} is in progress", ms_left / 1000
            )
        raise IdempotencyKeyReusedError(
            self.name, f"key {public!r} was used for a request with another fingerprint", None
        )

    def _outcome_op(self, claim: _Claim, result: Any) -> tuple[Op[Any], list[str | int | bytes]]:
        if result is _RUN:
            return RELEASE, [claim.owner]
        encoded = self.codec.dumps(result)
        return COMPLETE, [claim.owner, claim.fingerprint, encoded, self._ttl_ms]

    def _settled(self, claim: _Claim, guarded: Guarded[Any]) -> None:
        status = guarded.value
        if guarded.down is not None or status == "conflict":
            self.lock_lost += 1
            self._emit("lock_lost", f"the result for {claim.key!r} could not be stored")

    def _emit(self, kind: str, reason: str) -> None:
        if self.listeners:
            self.listeners.emit(
                Event(
                    kind=kind,
                    source=self.kind,
                    name=self.name,
                    time=self.clock.monotonic(),
                    reason=reason,
                )
            )

    def _settle(self, claim: _Claim, outcome: Any) -> Generator[Step, Any, None]:
        """Store the result (``outcome``) or release the claim (``outcome is _RUN``)."""
        if claim.where is None:
            return
        try:
            op, args = self._outcome_op(claim, outcome)
        except Exception:  # the codec cannot store this result: free the key, then say why
            yield from self._settle(claim, _RUN)
            raise
        if claim.where == "local":
            yield Apply(self.guard.local, op, claim.key, args)
            return
        self._settled(claim, (yield Apply(self.guard, op, claim.key, args)))

    # -- the steps ----------------------------------------------------------------------------

    def flow(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlowSteps:
        """Claim the key; run and store the result, or replay the stored one, or refuse."""
        claim = self._claim(args, kwargs)
        if claim is None:
            return (yield CALL)
        begun = yield Apply(self.guard, BEGIN, claim.key, self._begin_args(claim))
        decided = self._on_begin(claim, begun)
        if decided is not _RUN:
            return decided
        try:
            result = yield CALL
        except BaseException:
            yield from self._settle(claim, _RUN)
            raise
        yield from self._settle(claim, result)
        return result

    def lookup(self, key: str) -> IdempotencyRecord | None:
        """What the store holds for ``key`` (raises StoreUnavailableError when it is down)."""
        validate.text("key", key, error=ValueError)
        return self._record(self.store.apply(GET, f"idem:{self.name}:{key}"))

    async def lookup_async(self, key: str) -> IdempotencyRecord | None:
        """:meth:`lookup` for async callers."""
        validate.text("key", key, error=ValueError)
        return self._record(await self.store.apply_async(GET, f"idem:{self.name}:{key}"))

    def _record(self, peek: Peek) -> IdempotencyRecord | None:
        if peek is None:
            return None
        state, fingerprint, result, ms_left = peek
        if state == _DONE:
            return IdempotencyRecord("done", fingerprint, self.codec.loads(result), ms_left / 1000)
        return IdempotencyRecord("in_progress", fingerprint, None, ms_left / 1000)

    def describe(self) -> str:
        return (
            f"Idempotency({self.name!r}, ttl={self.ttl:g}s, lock_ttl={self.lock_ttl:g}s, "
            f"store={self.store.url}, on_store_error={self.guard.mode})"
        )


class OneTimeTokens:
    """One-time tokens: :meth:`issue` one per form or checkout, :meth:`consume` it on submit.

    Consuming is one atomic delete: of any number of concurrent submits with one token, exactly
    one gets ``True``. Unused tokens expire after ``ttl`` seconds. When the store is down,
    ``on_store_error`` decides (default ``"fail_closed"``: :class:`IdempotencyUnavailableError`;
    ``"fail_open"``: every token is accepted; ``"local"``: this process's memory).
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        ttl: float = defaults.IDEMPOTENCY_TOKEN_TTL,
        name: str = "tokens",
        on_store_error: StoreErrorMode = "fail_closed",
        breaker: CircuitBreaker | None = None,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
    ) -> None:
        self.ttl = validate.seconds("ttl", ttl, minimum=0.001)
        self.name = validate.text("name", name)
        self.store = resolve(store)
        self.guard = StoreGuard(
            self.store,
            on_store_error=check_mode(on_store_error),
            name=name,
            breaker=breaker,
            clock=clock,
            listeners=listeners,
        )
        self._ttl_ms = max(1, round(self.ttl * 1000))

    def _key(self, token: str) -> str:
        if not isinstance(token, str) or not token:
            raise ConfigError(f"token must be a non-empty string, got {token!r}")
        return f"token:{self.name}:{token}"

    def _issued(self, guarded: Guarded[bool]) -> None:
        if guarded.down is not None and guarded.down.mode == "fail_closed":
            raise IdempotencyUnavailableError(
                self.name, "the token store is unavailable", None
            ) from guarded.down.error

    def _consumed(self, guarded: Guarded[bool]) -> bool:
        down = guarded.down
        if down is not None and down.mode != "local":
            if down.mode == "fail_closed":
                raise IdempotencyUnavailableError(
                    self.name, "the token store is unavailable", None
                ) from down.error
            return True
        return bool(guarded.value)

    def issue(self) -> str:
        """A new token, valid for ``ttl`` seconds or until consumed."""
        token = secrets.token_urlsafe(24)
        self._issued(self.guard.apply(TOKEN_ISSUE, self._key(token), [self._ttl_ms]))
        return token

    async def issue_async(self) -> str:
        """:meth:`issue` for async callers."""
        token = secrets.token_urlsafe(24)
        self._issued(await self.guard.apply_async(TOKEN_ISSUE, self._key(token), [self._ttl_ms]))
        return token

    def consume(self, token: str) -> bool:
        """True exactly once per issued, unexpired token."""
        consumer = secrets.token_hex(8)
        return self._consumed(self.guard.apply(TOKEN_CONSUME, self._key(token), [consumer]))

    async def consume_async(self, token: str) -> bool:
        """:meth:`consume` for async callers."""
        consumer = secrets.token_hex(8)
        guarded = await self.guard.apply_async(TOKEN_CONSUME, self._key(token), [consumer])
        return self._consumed(guarded)

    def require(self, token: str) -> None:
        """Consume ``token`` or raise :class:`IdempotencyTokenError`."""
        if not self.consume(token):
            raise IdempotencyTokenError(self.name, "token unknown, expired or already used", None)

    async def require_async(self, token: str) -> None:
        """:meth:`require` for async callers."""
        if not await self.consume_async(token):
            raise IdempotencyTokenError(self.name, "token unknown, expired or already used", None)
