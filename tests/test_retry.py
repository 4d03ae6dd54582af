"""Retry: classification, Retry-After, deadlines, budgets, idempotency, levels, events.

Every test runs on a fake clock. :class:`AutoClock`'s ``async_sleep`` moves time by itself (as
``FakeClock.sleep`` does), so the async shell runs exactly like the sync one; the ``shell``
fixture runs each contract test through both.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from email.utils import format_datetime
from typing import Any, assert_type

import pytest

import floodwall as fw
from floodwall import ConfigError, Event, FakeClock, Retry, RetryBudget
from floodwall.backoff import Fixed, Linear, NoBackoff
from floodwall.classify import (
    DEFAULT_CLASSIFIER,
    Classifier,
    ErrorClass,
    http_status,
    parse_retry_after,
    retry_after_of,
)

T = Any


class AutoClock(FakeClock):
    """A fake clock whose async sleepers move time themselves, like its sync ones."""

    async def async_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


class Shell:
    """Runs a policy around a plain function through ``call`` or ``call_async``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def run(self, policy: fw.Policy, fn: Callable[[], T]) -> T:
        if self.kind == "sync":
            return policy.call(fn)

        async def coroutine() -> T:
            return fn()

        return asyncio.run(policy.call_async(coroutine))

    def __repr__(self) -> str:
        return self.kind


@pytest.fixture(params=["sync", "async"])
def shell(request: pytest.FixtureRequest) -> Shell:
    return Shell(str(request.param))


@pytest.fixture
def auto() -> AutoClock:
    return AutoClock(1000.0)


class Script:
    """A callable that plays its outcomes in order (exceptions are raised), then returns "ok".

    Records the retry marker and idempotency key it saw on every call, and can move the
    clock by ``takes`` seconds per call (an attempt's duration).
    """

    def __init__(self, *outcomes: object, clock: FakeClock | None = None, takes: float = 0.0):
        self.outcomes = list(outcomes)
        self.calls = 0
        self.markers: list[fw.RetryMarker | None] = []
        self.keys: list[str | None] = []
        self.clock = clock
        self.takes = takes

    def __call__(self) -> Any:
        self.calls += 1
        self.markers.append(fw.current_retry())
        self.keys.append(fw.current_idempotency_key())
        if self.clock is not None and self.takes:
            self.clock.advance(self.takes)
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class Response:
    """A duck-typed HTTP response (as httpx and requests have)."""

    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.headers = headers or {}

    def __repr__(self) -> str:
        return f"<Response {self.status_code}>"


class HTTPError(Exception):
    """A duck-typed HTTP status error (``exc.response.status_code``, as httpx and requests)."""

    def __init__(self, response: Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def make(clock: FakeClock, **kwargs: Any) -> Retry:
    kwargs.setdefault("backoff", Fixed(0.1))
    kwargs.setdefault("budget", None)
    return Retry("r", clock=clock, **kwargs)


def record(policy: Retry) -> list[Event]:
    events: list[Event] = []
    policy.add_listener(events.append)
    return events


# -- the basic loop -----------------------------------------------------------------------------


def test_success_first_time_costs_nothing_visible(shell: Shell, auto: AutoClock) -> None:
    policy = make(auto, budget=RetryBudget(clock=auto))
    script = Script("value")
    assert shell.run(policy, script) == "value"
    assert auto.sleeps == []
    assert script.markers == [None]  # no marker on a first attempt
    assert (policy.calls, policy.retries, policy.failed) == (1, 0, 0)
    assert policy.budget is not None
    assert policy.budget.snapshot().requests == 1


def test_transient_errors_are_retried_after_the_backoff(shell: Shell, auto: AutoClock) -> None:
    policy = make(auto, attempts=4, backoff=Linear(0.1))
    script = Script(ConnectionResetError("a"), TimeoutError("b"), "done")
    assert shell.run(policy, script) == "done"
    assert auto.sleeps == pytest.approx([0.1, 0.2])
    assert script.markers == [None, fw.RetryMarker(2, "r"), fw.RetryMarker(3, "r")]
    assert fw.current_retry() is None  # reset after the call
    assert (policy.calls, policy.retries, policy.recovered, policy.failed) == (1, 2, 1, 0)


def test_out_of_attempts_raises_the_last_error_with_a_note(shell: Shell, auto: AutoClock) -> None:
    errors = [ConnectionError("1"), ConnectionError("2"), ConnectionError("3")]
    policy = make(auto)
    with pytest.raises(ConnectionError) as caught:
        shell.run(policy, Script(*errors))
    assert caught.value is errors[2]
    assert caught.value.__context__ is None  # not chained to the earlier attempts' errors
    assert caught.value.__notes__ == [
        "floodwall: retry 'r' gave up after 3 attempt(s): no attempts left (attempts=3)"
    ]
    record_ = fw.gave_up(caught.value)
    assert record_ is not None
    assert (record_.policy, record_.attempts, record_.cause) == ("r", 3, "attempts")
    assert record_.final
    assert policy.failed == 1


def test_attempts_one_never_retries(auto: AutoClock) -> None:
    script = Script(ConnectionError())
    with pytest.raises(ConnectionError) as caught:
        make(auto, attempts=1).call(script)
    assert script.calls == 1
    assert not hasattr(caught.value, "__notes__")  # nothing surprising happened


def test_base_exceptions_pass_straight_through(shell: Shell, auto: AutoClock) -> None:
    script = Script(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        shell.run(make(auto), script)
    assert script.calls == 1


async def test_cancellation_is_never_retried(auto: AutoClock) -> None:
    policy = make(auto)
    calls = 0

    async def slow() -> None:
        nonlocal calls
        calls += 1
        await asyncio.Event().wait()

    task = asyncio.create_task(policy.call_async(slow))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1


# -- classification -------------------------------------------------------------------------


class Declined(Exception):
    pass


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (Declined("card declined"), "business"),
        (HTTPError(Response(404)), "business"),
        (HTTPError(Response(400)), "business"),
        (RuntimeError("bug"), "not_retryable"),
        (ValueError("bad"), "not_retryable"),
        (fw.CircuitOpenError("b", fw.CircuitState.OPEN, 1.0), "overload"),
        (fw.RateLimitedError("rl", "10/s", 0.5), "overload"),
        (fw.BulkheadFullError("bh", "full"), "overload"),
        (fw.OverloadedError("shed", "queue too long", 1.0), "overload"),
        (HTTPError(Response(429, {"Retry-After": "1"})), "overload"),
        (HTTPError(Response(503)), "overload"),
    ],
)
def test_what_is_not_retried(shell: Shell, auto: AutoClock, error: Exception, cause: str) -> None:
    events: list[Event] = []
    policy = make(auto, business=Declined, listeners=[events.append])
    script = Script(error)
    with pytest.raises(type(error)) as caught:
        shell.run(policy, script)
    assert script.calls == 1
    assert auto.sleeps == []
    assert not hasattr(caught.value, "__notes__")  # the error as the dependency raised it
    assert [e.kind for e in events] == ["attempt", "given_up"]
    assert events[-1].figures["cause"] == cause


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(),
        BrokenPipeError(),
        TimeoutError(),
        fw.TimeoutExceeded("t", 1.0),
        HTTPError(Response(502)),
        HTTPError(Response(504)),
        HTTPError(Response(500)),
        HTTPError(Response(408)),
    ],
)
def test_transient_errors_are_retried(auto: AutoClock, error: Exception) -> None:
    script = Script(error)
    assert make(auto).call(script) == "ok"
    assert script.calls == 2


def test_retry_on_adds_types_but_never_overrides_the_classes(auto: AutoClock) -> None:
    policy = make(auto, retry_on=(RuntimeError, Declined), business=Declined)
    assert policy.call(Script(RuntimeError())) == "ok"
    with pytest.raises(Declined):
        policy.call(Script(Declined()))
    with pytest.raises(fw.CircuitOpenError):
        make(auto, retry_on=Exception).call(Script(fw.CircuitOpenError("b", "open", None)))


def test_classifier_order_and_extension() -> None:
    classify = DEFAULT_CLASSIFIER.classify
    assert classify(ConnectionError()) is ErrorClass.TRANSIENT
    assert classify(fw.TimeoutExceeded("t", 1.0)) is ErrorClass.TRANSIENT  # a timeout, not a no
    assert classify(fw.RejectedError("x", "no", None)) is ErrorClass.OVERLOAD
    assert classify(KeyError()) is ErrorClass.UNKNOWN
    assert classify(HTTPError(Response(418))) is ErrorClass.BUSINESS
    assert classify(HTTPError(Response(599))) is ErrorClass.UNKNOWN
    custom = DEFAULT_CLASSIFIER.with_types(
        business=(ConnectionAbortedError,), transient=(KeyError,)
    )
    assert custom.classify(ConnectionAbortedError()) is ErrorClass.BUSINESS  # business first
    assert custom.classify(KeyError()) is ErrorClass.TRANSIENT
    assert DEFAULT_CLASSIFIER.classify_result(Response(503)) is ErrorClass.OVERLOAD
    assert DEFAULT_CLASSIFIER.classify_result(Response(200)) is ErrorClass.TRANSIENT


def test_http_status_duck_typing() -> None:
    class Aio(Exception):
        status = 503

    class Flag:
        status_code = True

    assert http_status(Response(502)) == 502
    assert http_status(HTTPError(Response(404))) == 404
    assert http_status(Aio()) == 503
    assert http_status(Flag()) is None  # a bool is not a status
    assert http_status(ValueError()) is None


# -- results --------------------------------------------------------------------------------


def test_failed_results_are_retried_then_returned(shell: Shell, auto: AutoClock) -> None:
    policy = make(auto, retry_on_result=lambda r: isinstance(r, Response) and r.status_code >= 500)
    script = Script(Response(502), Response(502), Response(502))
    answer = shell.run(policy, script)
    assert isinstance(answer, Response)
    assert answer.status_code == 502  # the last result, as the dependency gave it
    assert script.calls == 3
    assert shell.run(policy, Script(Response(502), Response(200))).status_code == 200


def test_overloaded_result_is_not_retried_by_default(auto: AutoClock) -> None:
    policy = make(auto, retry_on_result=lambda r: r.status_code >= 500)
    script = Script(Response(503, {"Retry-After": "2"}))
    assert policy.call(script).status_code == 503
    assert script.calls == 1


# -- Retry-After ----------------------------------------------------------------------------


def test_overload_retried_only_after_retry_after(shell: Shell, auto: AutoClock) -> None:
    policy = make(auto, retry_overload=True, backoff=Fixed(0.1))
    script = Script(fw.RateLimitedError("rl", "10/s", 2.5))
    assert shell.run(policy, script) == "ok"
    assert auto.sleeps == [2.5]  # the server's wait, longer than the backoff
    script = Script(fw.RateLimitedError("rl", "10/s", 0.01))
    assert shell.run(policy, script) == "ok"
    assert auto.sleeps[-1] == 0.1  # never shorter than the backoff
    no_hint = Script(fw.CircuitOpenError("b", fw.CircuitState.FORCED_OPEN, None))
    with pytest.raises(fw.CircuitOpenError):
        shell.run(policy, no_hint)
    assert no_hint.calls == 1  # no retry_after: not retried even with retry_overload


def test_retry_after_is_capped(auto: AutoClock) -> None:
    policy = make(auto, retry_overload=True, max_retry_after=5.0)
    assert policy.call(Script(HTTPError(Response(429, {"Retry-After": "3600"})))) == "ok"
    assert auto.sleeps == [5.0]


def test_retry_after_on_a_result_and_on_a_transient_error(auto: AutoClock) -> None:
    policy = make(auto, retry_overload=True, retry_on_result=lambda r: r.status_code != 200)
    assert policy.call(Script(Response(503, {"retry-after": "1.5"}), Response(200))).status_code
    assert auto.sleeps == [1.5]
    make(auto).call(Script(HTTPError(Response(502, {"Retry-After": "0.7"}))))
    assert auto.sleeps[-1] == 0.7


def test_parse_retry_after() -> None:
    now = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)
    later = format_datetime(now + datetime.timedelta(seconds=90), usegmt=True)
    earlier = format_datetime(now - datetime.timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(" 120 ", now.timestamp()) == 120.0
    assert parse_retry_after(later, now.timestamp()) == pytest.approx(90.0)
    assert parse_retry_after(earlier, now.timestamp()) == 0.0
    assert parse_retry_after("soon", now.timestamp()) is None
    assert parse_retry_after("nan", now.timestamp()) is None
    classifier = Classifier(wall_clock=now.timestamp)
    assert classifier.retry_after(Response(503, {"Retry-After": later})) == pytest.approx(90.0)
    assert retry_after_of(fw.RateLimitedError("x", "y", 3.0)) == 3.0

    class Hinted(Exception):
        retry_after = 4

    assert retry_after_of(Hinted()) == 4.0
    assert retry_after_of(ValueError()) is None


# -- deadlines ------------------------------------------------------------------------------


def test_no_retry_that_cannot_finish_before_the_deadline(shell: Shell, auto: AutoClock) -> None:
    events: list[Event] = []
    policy = make(auto, attempts=5, backoff=Fixed(0.4), listeners=[events.append])
    script = Script(*[ConnectionError(str(n)) for n in range(5)], clock=auto, takes=0.2)

    def run() -> object:
        with fw.deadline(1.5, clock=auto):
            return shell.run(policy, script)

    with pytest.raises(ConnectionError) as caught:
        run()
    # t=0.2 fail, wait 0.4; t=0.8 fail, wait 0.4; t=1.4: 0.4 + 0.2 > 0.1 left -> stop
    assert script.calls == 3
    assert auto.sleeps == [0.4, 0.4]
    assert "past the deadline (0.100s left)" in caught.value.__notes__[0]
    assert events[-1].figures["cause"] == "deadline"


def test_own_deadline_bounds_all_attempts_and_is_ambient(auto: AutoClock) -> None:
    policy = make(auto, attempts=10, backoff=Fixed(1.0), deadline=2.5)
    seen: list[float | None] = []

    def failing() -> None:
        seen.append(fw.remaining())
        raise ConnectionError

    with pytest.raises(ConnectionError):
        policy.call(failing)
    assert seen == [2.5, 1.5, 0.5]  # a fourth attempt would start after the deadline
    assert fw.remaining() is None
    with fw.deadline(1.2, clock=auto), pytest.raises(ConnectionError):
        policy.call(failing)
    assert seen[-2:] == pytest.approx([1.2, 0.2])  # an outer, sooner deadline wins


# -- budgets --------------------------------------------------------------------------------


def test_budget_refusal_surfaces_the_original_error(shell: Shell, auto: AutoClock) -> None:
    budget = RetryBudget(0.0, min_per_second=0.0, name="db", clock=auto)
    events: list[Event] = []
    policy = make(auto, budget=budget, listeners=[events.append])
    error = ConnectionError("down")
    with pytest.raises(ConnectionError) as caught:
        shell.run(policy, Script(error))
    assert caught.value is error
    assert caught.value.__notes__[0].startswith("RetryBudgetExhausted: 'db': retry budget")
    record_ = fw.gave_up(error)
    assert record_ is not None
    assert record_.cause == "budget"
    assert isinstance(record_.budget, fw.RetryBudgetExhausted)
    assert [e.kind for e in events] == ["attempt", "budget_exhausted", "given_up"]
    assert events[1].figures == {"requests": 1, "retries": 0, "allowance": 0.0, "ratio": 0.0}
    assert policy.budget_refusals == 1


def test_default_budget_is_private_and_bounds_retries(auto: AutoClock) -> None:
    policy = Retry("p", backoff=NoBackoff(), clock=auto)
    assert policy.budget is not None
    assert policy.budget.ratio == 0.1
    for _ in range(20):
        with pytest.raises(ConnectionError):
            policy.call(Script(ConnectionError(), ConnectionError(), ConnectionError()))
    # 20 requests in the window: 0.1 × 20 + 1/s × 10 s = 12 retries, not 40. Calls 1-5 get
    # both their retries (10 <= 0.1 × 5 + 10); from call 6 on every call is refused once, and
    # calls 10 and 20 get the one retry their deposit frees up.
    assert policy.retries == 12
    assert policy.budget_refusals == 15
    assert policy.failed == 20


def test_a_shared_budget_bounds_several_policies(auto: AutoClock) -> None:
    budget = RetryBudget(0.5, min_per_second=0, clock=auto)
    a = Retry("a", budget=budget, backoff=NoBackoff(), clock=auto)
    b = Retry("b", budget=budget, backoff=NoBackoff(), clock=auto)
    assert budget.shared
    for policy in (a, b) * 5:
        with pytest.raises(ConnectionError):
            policy.call(Script(*[ConnectionError()] * 3))
    assert a.retries + b.retries == 5  # 0.5 × 10 requests


# -- idempotency, levels, switches ------------------------------------------------------------


def test_writes_are_retried_only_with_an_idempotency_key(shell: Shell, auto: AutoClock) -> None:
    policy = make(auto, idempotent=False)
    script = Script(ConnectionError())
    with pytest.raises(ConnectionError) as caught:
        shell.run(policy, script)
    assert script.calls == 1
    assert "idempotent=False and the call carries no idempotency key" in caught.value.__notes__[0]
    keyed = Script(ConnectionError())
    with fw.idempotency_key("order-42"):
        assert shell.run(policy, keyed) == "ok"
    assert keyed.keys == ["order-42", "order-42"]  # every attempt carries the same key


@pytest.mark.parametrize(
    ("level", "max_level", "retried"),
    [(None, 2, True), (1, 2, True), (2, 2, True), (3, 2, False), (3, 3, True), (1, 0, False)],
)
def test_dependency_levels(
    auto: AutoClock, level: int | None, max_level: int, retried: bool
) -> None:
    script = Script(ConnectionError())
    policy = make(auto, level=level, max_level=max_level)
    if retried:
        assert policy.call(script) == "ok"
    else:
        with pytest.raises(ConnectionError) as caught:
            policy.call(script)
        assert "max_level" in caught.value.__notes__[0]
    assert script.calls == (2 if retried else 1)


def test_disable_and_enable(shell: Shell, auto: AutoClock) -> None:
    policy = make(auto)
    events = record(policy)
    policy.disable("level-3 dependencies switched off")
    assert not policy.enabled
    with pytest.raises(ConnectionError) as caught:
        shell.run(policy, Script(ConnectionError()))
    assert "level-3 dependencies switched off" in caught.value.__notes__[0]
    policy.enable()
    assert shell.run(policy, Script(ConnectionError())) == "ok"
    assert [e.kind for e in events if e.kind in ("disabled", "enabled")] == ["disabled", "enabled"]


# -- events ---------------------------------------------------------------------------------


def test_events_of_a_recovered_call(auto: AutoClock) -> None:
    policy = make(auto)
    events = record(policy)
    policy.call(Script(ConnectionError("blip")))
    assert [e.kind for e in events] == ["attempt", "retry_scheduled", "attempt"]
    scheduled = events[1]
    assert scheduled.figures["delay"] == 0.1
    assert scheduled.figures["attempt"] == 2
    assert scheduled.figures["error_class"] == "TRANSIENT"
    assert scheduled.reason == "ConnectionError (transient); attempt 2 in 0.100s"
    assert [e.figures["attempt"] for e in events if e.kind == "attempt"] == [1, 2]


def test_given_up_event_carries_attempts_and_last_error(auto: AutoClock) -> None:
    policy = make(auto)
    events = record(policy)
    with pytest.raises(HTTPError):
        policy.call(Script(ConnectionError(), HTTPError(Response(404))))
    last = events[-1]
    assert last.kind == "given_up"
    assert last.figures["attempts"] == 2
    assert last.figures["error"] == "HTTPError (HTTP 404)"
    assert last.figures["cause"] == "business"


def test_a_failing_listener_never_breaks_the_call(auto: AutoClock) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("listener bug")

    policy = make(auto, listeners=[broken])
    assert policy.call(Script(ConnectionError())) == "ok"
    assert policy.listeners.errors == 3


# -- composition and the decorator ------------------------------------------------------------


def test_retry_inside_a_pipeline_stops_on_an_open_breaker(auto: AutoClock) -> None:
    breaker = fw.CircuitBreaker("db", minimum_calls=2, failure_rate=0.5, clock=auto)
    pipeline = fw.Pipeline(make(auto, attempts=5), breaker)
    script = Script(*[ConnectionError()] * 10)
    with pytest.raises(fw.CircuitOpenError):
        pipeline.call(script)
    assert script.calls == 2  # the breaker opened after two failures; its "no" is not retried


def test_decorates_functions_coroutines_and_methods(auto: AutoClock) -> None:
    policy = make(auto)
    script = Script(ConnectionError())

    @policy
    def plain(x: int) -> int:
        script()
        return x * 2

    @policy
    async def coroutine(x: int) -> int:
        return x + 1

    class Client:
        @policy
        def get(self, path: str) -> str:
            return path.upper()

    assert assert_type(plain(21), int) == 42
    assert assert_type(asyncio.run(coroutine(1)), int) == 2
    assert assert_type(Client().get("/a"), str) == "/A"
    assert assert_type(policy.call(plain, 1), int) == 2
    assert plain.__name__ == "plain"


async def test_async_attempts_run_in_the_callers_task(auto: AutoClock) -> None:
    policy = make(auto)
    tasks: list[asyncio.Task[Any] | None] = []
    failures = [ConnectionError()]

    async def work() -> str:
        tasks.append(asyncio.current_task())
        if failures:
            raise failures.pop()
        return "ok"

    assert await policy.call_async(work) == "ok"
    assert tasks[0] is tasks[1] is asyncio.current_task()


def test_describe(auto: AutoClock) -> None:
    policy = Retry("db", attempts=4, deadline=2.0, idempotent=False, level=1, clock=auto)
    text = policy.describe()
    assert text.startswith("Retry('db', attempts=4, backoff=FullJitter(base=0.1")
    assert "budget='db.budget'" in text
    assert "deadline=2s" in text
    assert "idempotent=False" in text
    assert "level=1" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "attempts must be an integer >= 1, got 0"),
        ({"attempts": 2.5}, "attempts must be an integer >= 1, got 2.5"),
        ({"backoff": 0.5}, "backoff must have a delays"),
        ({"deadline": 0}, "deadline must be a finite number of seconds > 0, got 0"),
        ({"retry_on": [ValueError]}, "retry_on must be an exception type or a tuple of them, got"),
        ({"business": "Declined"}, "business must be an exception type or a tuple of them"),
        ({"retry_on_result": 3}, "retry_on_result must be callable, got 3"),
        ({"max_retry_after": -1}, "max_retry_after must be a finite number of seconds >= 0"),
        ({"budget": 0.1}, "budget must be a RetryBudget or None, got 0.1"),
        ({"level": 0}, "level must be an integer >= 1, got 0"),
        ({"max_level": -1}, "max_level must be an integer >= 0, got -1"),
    ],
)
def test_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Retry(**kwargs)
