"""Idempotency as a policy: replay, 409 in flight, 422 on reuse, release on error, lapsed
claims, store outages, one-time tokens. Unit tests on the memory store with a fake clock; the
same policy over every store at the end."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Sequence

import pytest

import floodwall
from conftest import Shell, StoreCase
from floodwall import ConfigError, Event, FakeClock, Pipeline, Retry
from floodwall.shared.idempotency import (
    BEGIN,
    DuplicateInFlightError,
    Idempotency,
    IdempotencyKeyMissingError,
    IdempotencyKeyReusedError,
    IdempotencyTokenError,
    IdempotencyUnavailableError,
    OneTimeTokens,
    fingerprint_of,
)
from floodwall.stores import Arg, MemoryStore, Op, R, Store, StoreUnavailableError


def _policy(clock: FakeClock, **options: object) -> Idempotency:
    return Idempotency(MemoryStore(clock=clock), clock=clock, **options)  # type: ignore[arg-type]


class Ledger:
    """A non-idempotent write that counts its executions."""

    def __init__(self) -> None:
        self.runs = 0

    def charge(self, amount: int) -> dict[str, int]:
        self.runs += 1
        return {"charge": self.runs, "amount": amount}


def test_a_repeat_gets_the_stored_result(clock: FakeClock, shell: Shell) -> None:
    idem = _policy(clock)
    ledger = Ledger()
    with floodwall.idempotency_key("order-1"):
        first = shell.run(idem, lambda: ledger.charge(10))
        again = shell.run(idem, lambda: ledger.charge(10))
    assert first == again == {"charge": 1, "amount": 10}
    assert ledger.runs == 1 and idem.executions == 1 and idem.replays == 1
    record = idem.lookup("order-1")
    assert record is not None and record.state == "done" and record.result == first
    assert record.expires_in == pytest.approx(86400)


def test_without_a_key_the_call_runs_unprotected_or_is_refused(clock: FakeClock) -> None:
    ledger = Ledger()
    _policy(clock).call(ledger.charge, 1)
    _policy(clock).call(ledger.charge, 1)
    assert ledger.runs == 2
    with pytest.raises(IdempotencyKeyMissingError) as caught:
        _policy(clock, required=True).call(ledger.charge, 1)
    assert caught.value.kind == "idempotency_key_missing"


async def test_a_concurrent_duplicate_gets_409(clock: FakeClock) -> None:
    idem = _policy(clock)
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "done"

    with floodwall.idempotency_key("k"):
        first = asyncio.create_task(idem.call_async(slow))
        await started.wait()
        with pytest.raises(DuplicateInFlightError) as caught:
            await idem.call_async(slow)
        release.set()
        assert await first == "done"
        assert await idem.call_async(slow) == "done"
    error = caught.value
    assert error.kind == "duplicate_in_flight" and error.retry_after == pytest.approx(60)
    assert "'k' is in progress" in str(error)
    assert pickle.loads(pickle.dumps(error)).retry_after == error.retry_after


def test_a_reused_key_with_another_fingerprint_is_rejected(clock: FakeClock) -> None:
    idem = _policy(clock, fingerprint=fingerprint_of)
    ledger = Ledger()
    with floodwall.idempotency_key("k"):
        idem.call(ledger.charge, 10)
        assert idem.call(ledger.charge, 10)["amount"] == 10
        with pytest.raises(IdempotencyKeyReusedError) as caught:
            idem.call(ledger.charge, 99)
    assert caught.value.kind == "idempotency_key_reused" and ledger.runs == 1


def test_a_failed_call_releases_its_claim_so_a_retry_runs(clock: FakeClock) -> None:
    idem = _policy(clock)
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("downstream blip")
        return "ok"

    retry = Retry(attempts=3, idempotent=False, clock=clock)
    with floodwall.idempotency_key("pay-1"):
        assert Pipeline(retry, idem).call(flaky) == "ok"
        assert Pipeline(retry, idem).call(flaky) == "ok"
    assert len(attempts) == 3 and idem.executions == 3 and idem.replays == 1


def test_a_crashed_owners_claim_lapses_after_lock_ttl(clock: FakeClock) -> None:
    store = MemoryStore(clock=clock)
    crashed = Idempotency(store, lock_ttl=30, clock=clock)
    crashed.store.apply(
        BEGIN,
        "idem:idempotency:k",
        ["dead-owner", "", 30_000],
    )
    ledger = Ledger()
    with floodwall.idempotency_key("k"):
        with pytest.raises(DuplicateInFlightError):
            crashed.call(ledger.charge, 1)
        clock.advance(30)
        assert crashed.call(ledger.charge, 1)["charge"] == 1


def test_a_call_outliving_its_claim_cannot_overwrite_the_next_owner(clock: FakeClock) -> None:
    events: list[Event] = []
    idem = _policy(clock, lock_ttl=5, listeners=[events.append])
    inner = _policy(clock, lock_ttl=5)
    inner.store = idem.store
    inner.guard.store = idem.store

    def slow() -> str:
        clock.advance(6)  # our claim lapses; another request takes the key meanwhile
        assert inner.call(lambda: "second") == "second"
        return "first"

    with floodwall.idempotency_key("k"):
        assert idem.call(slow) == "first", "the caller still gets its own result"
        assert idem.call(lambda: "third") == "second"
    assert idem.lock_lost == 1 and [e.kind for e in events] == ["lock_lost"]


def test_results_the_codec_cannot_store_free_the_key(clock: FakeClock) -> None:
    idem = _policy(clock)
    with floodwall.idempotency_key("k"):
        with pytest.raises(TypeError, match="not JSON serializable"):
            idem.call(object)
        assert idem.call(lambda: [1, 2]) == [1, 2]


def test_key_callable_and_bytes_fingerprint(clock: FakeClock) -> None:
    idem = _policy(clock, key=lambda order, body: order, fingerprint=lambda order, body: body)
    assert idem.call(lambda order, body: len(body), "o1", b"abc") == 3
    assert idem.call(lambda order, body: -1, "o1", b"abc") == 3
    with pytest.raises(IdempotencyKeyReusedError):
        idem.call(lambda order, body: -1, "o1", b"abd")
    with pytest.raises(ConfigError, match="non-empty string"):
        idem.call(lambda order, body: 0, "", b"")


class DownStore(Store):
    """A store whose server is gone (every op fails the way a refused connection does)."""

    def __init__(self) -> None:
        super().__init__("down://test", prefix="d:")

    def apply(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as exc:
            raise StoreUnavailableError(self.url, op.script) from exc

    async def apply_async(self, op: Op[R], key: str, args: Sequence[Arg] = ()) -> R:
        return self.apply(op, key, args)


def test_store_down_fail_closed_refuses_with_503(clock: FakeClock, shell: Shell) -> None:
    idem = Idempotency(DownStore(), clock=clock)
    ledger = Ledger()
    with floodwall.idempotency_key("k"), pytest.raises(IdempotencyUnavailableError) as caught:
        shell.run(idem, lambda: ledger.charge(1))
    assert ledger.runs == 0 and caught.value.kind == "idempotency_unavailable"
    assert isinstance(caught.value.__cause__, StoreUnavailableError)


def test_store_down_fail_open_runs_unprotected(clock: FakeClock, shell: Shell) -> None:
    idem = Idempotency(DownStore(), on_store_error="fail_open", clock=clock)
    ledger = Ledger()
    with floodwall.idempotency_key("k"):
        shell.run(idem, lambda: ledger.charge(1))
        shell.run(idem, lambda: ledger.charge(1))
    assert ledger.runs == 2


def test_store_down_local_dedupes_in_this_process(clock: FakeClock, shell: Shell) -> None:
    idem = Idempotency(DownStore(), on_store_error="local", clock=clock)
    ledger = Ledger()
    with floodwall.idempotency_key("k"):
        assert shell.run(idem, lambda: ledger.charge(1)) == shell.run(
            idem, lambda: ledger.charge(1)
        )
    assert ledger.runs == 1 and idem.guard.degraded == 2, "the result went to the local store"


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="lock_ttl must be <= ttl"):
        Idempotency(ttl=10, lock_ttl=60)
    with pytest.raises(ConfigError, match="ttl must be"):
        Idempotency(ttl=0)


def test_one_time_tokens(clock: FakeClock) -> None:
    tokens = OneTimeTokens(MemoryStore(clock=clock), ttl=600, clock=clock)
    token = tokens.issue()
    assert tokens.consume(token) is True
    assert tokens.consume(token) is False
    with pytest.raises(IdempotencyTokenError):
        tokens.require(token)
    late = tokens.issue()
    clock.advance(600)
    assert tokens.consume(late) is False
    with pytest.raises(IdempotencyUnavailableError):
        OneTimeTokens(DownStore(), clock=clock).issue()
    assert OneTimeTokens(DownStore(), on_store_error="fail_open").consume("x") is True


# -- every store, through the policy --------------------------------------------------------


def test_idempotency_on_every_store(store_case: StoreCase) -> None:
    idem = Idempotency(store_case.store, fingerprint=fingerprint_of, lock_ttl=0.3)
    ledger = Ledger()
    with floodwall.idempotency_key("order-9"):
        assert idem.call(ledger.charge, 5) == idem.call(ledger.charge, 5)
        with pytest.raises(IdempotencyKeyReusedError):
            idem.call(ledger.charge, 6)
    assert ledger.runs == 1
    record = idem.lookup("order-9")
    assert record is not None and record.result == {"charge": 1, "amount": 5}


async def test_idempotency_async_on_every_store(async_store_case: StoreCase) -> None:
    idem = Idempotency(async_store_case.store)
    runs = 0

    async def write() -> int:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.05)
        return runs

    with floodwall.idempotency_key("k"):
        results = await asyncio.gather(
            *(idem.call_async(write) for _ in range(5)), return_exceptions=True
        )
        assert await idem.call_async(write) == 1
    assert runs == 1
    # Each duplicate either met the first call in flight (refused) or found it completed (its
    # answer replayed): which one depends on scheduling, never on a second run.
    assert 1 in results
    assert all(r == 1 or isinstance(r, DuplicateInFlightError) for r in results)
    tokens = OneTimeTokens(async_store_case.store)
    token = await tokens.issue_async()
    assert [await tokens.consume_async(token) for _ in range(2)] == [True, False]
    with pytest.raises(IdempotencyTokenError):
        await tokens.require_async(token)
