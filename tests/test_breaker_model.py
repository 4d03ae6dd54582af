"""Hypothesis stateful test: the breaker against a tiny reference model of its semantics.

The model keeps every call (time, kind, slow) in a list and recomputes the window from scratch
on each decision; the breaker keeps buckets and running counters. They must agree on every
state, every rejection and every window figure, whatever the sequence of calls, time jumps and
operator switches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from floodwall import CircuitBreaker, CircuitOpenError, CircuitState, FakeClock

S = CircuitState
BUCKET = 1.0
BUCKETS = 10
MIN_CALLS = 5
RATE = 0.5
SLOW = 1.0
SLOW_RATE = 0.8
OPEN = 5.0
PROBES = 2
PROBE_TIMEOUT = 7.0


class Boom(Exception):
    pass


@dataclass
class Model:
    state: S = S.CLOSED
    calls: list[tuple[int, int, bool]] = field(default_factory=list)  # (epoch, kind, slow)
    changed_at: float = 0.0
    probes: int = 0
    probe_ok: int = 0
    rejected: int = 0

    def live(self, now: float) -> list[tuple[int, int, bool]]:
        epoch = math.floor(now / BUCKET)
        return [c for c in self.calls if c[0] > epoch - BUCKETS]

    def move(self, to: S, now: float) -> None:
        self.state = to
        self.changed_at = now
        self.probes = self.probe_ok = 0
        if to in (S.CLOSED, S.DISABLED, S.HALF_OPEN):
            self.calls = []

    def acquire(self, now: float) -> bool:
        if self.state is S.OPEN:
            if now - self.changed_at < OPEN:
                self.rejected += 1
                return False
            self.move(S.HALF_OPEN, now)
        if self.state is S.HALF_OPEN:
            if self.probes < PROBES:
                self.probes += 1
                return True
            if now - self.changed_at >= PROBE_TIMEOUT:
                self.move(S.OPEN, now)
            self.rejected += 1
            return False
        if self.state is S.FORCED_OPEN:
            self.rejected += 1
            return False
        return True

    def finish(self, now: float, failed: bool, slow: bool) -> None:
        if self.state is S.HALF_OPEN:
            if failed or slow:
                self.move(S.OPEN, now)
            else:
                self.probe_ok += 1
                if self.probe_ok >= PROBES:
                    self.move(S.CLOSED, now)
            return
        if self.state not in (S.CLOSED, S.DISABLED):
            return
        self.calls.append((math.floor(now / BUCKET), int(failed), slow))
        if self.state is S.CLOSED:  # judged on every call, as resilience4j does
            live = self.live(now)
            n = len(live)
            errors = sum(1 for c in live if c[1])
            slows = sum(1 for c in live if c[2])
            if n >= MIN_CALLS and (errors >= RATE * n or slows >= SLOW_RATE * n):
                self.move(S.OPEN, now)


class BreakerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.breaker = CircuitBreaker(
            "model",
            clock=self.clock,
            minimum_calls=MIN_CALLS,
            failure_rate=RATE,
            slow_call_rate=SLOW_RATE,
            slow_call_duration=SLOW,
            window=BUCKET * BUCKETS,
            buckets=BUCKETS,
            open_duration=OPEN,
            half_open_calls=PROBES,
            probe_timeout=PROBE_TIMEOUT,
        )
        self.model = Model()

    # Dyadic durations keep the fake clock exact: end - start equals the duration to the bit.
    @rule(seconds=st.sampled_from([0.0, 0.25, 0.75, 1.0, 2.5, 5.0, 7.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(failed=st.booleans(), duration=st.sampled_from([0.0, 0.25, 1.0, 1.5]))
    def call(self, failed: bool, duration: float) -> None:
        clock = self.clock
        start = clock.monotonic()
        admitted = self.model.acquire(start)

        def fn() -> int:
            clock.advance(duration)
            if failed:
                raise Boom
            return 1

        try:
            self.breaker.call(fn)
            assert admitted and not failed
        except CircuitOpenError:
            assert not admitted
        except Boom:
            assert admitted and failed
        if admitted:
            self.model.finish(clock.monotonic(), failed, duration > SLOW)

    @rule()
    def hang_a_probe(self) -> None:
        """Take a permit and never report back (a probe that hangs)."""
        admitted = self.model.acquire(self.clock.monotonic())
        permit = self.breaker.acquire(self.clock.monotonic())
        assert (permit >= 0) == admitted

    @precondition(lambda self: self.model.state is not S.HALF_OPEN)
    @rule(to=st.sampled_from(["force_open", "force_closed", "disable", "reset"]))
    def operator(self, to: str) -> None:
        getattr(self.breaker, to)()
        target = {
            "force_open": S.FORCED_OPEN,
            "force_closed": S.FORCED_CLOSED,
            "disable": S.DISABLED,
            "reset": S.CLOSED,
        }[to]
        self.model.move(target, self.clock.monotonic())

    @invariant()
    def same_state(self) -> None:
        assert self.breaker._state is self.model.state

    @invariant()
    def same_window(self) -> None:
        now = self.clock.monotonic()
        snap = self.breaker.metrics()
        if self.model.state in (S.CLOSED, S.DISABLED):
            live = self.model.live(now)
            assert snap.calls == len(live)
            assert snap.failures == sum(1 for c in live if c[1])
            assert snap.slow_calls == sum(1 for c in live if c[2])

    @invariant()
    def same_rejections(self) -> None:
        assert self.breaker.rejected == self.model.rejected


BreakerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestBreakerModel = BreakerMachine.TestCase
