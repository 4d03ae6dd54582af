"""The retry marker on the wire of each queue (issue 21): a task published while a marker is
ambient (inside a retried task, or a request that arrived as a retry) carries it, so the task
does not retry again; one published outside any marker carries nothing.

In-process brokers of the queue libraries themselves (kombu's ``memory://`` transport,
Dramatiq's ``StubBroker``): what is checked is the message each library would send.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import floodwall as fw
from floodwall.integrations._tasks import RETRY, Delivery


def test_celery_publishes_the_ambient_marker_in_the_message_headers() -> None:
    from celery import Celery

    import floodwall.celery  # noqa: F401 - connects before_task_publish

    app = Celery("markers", broker="memory://")
    with fw.retry_marker(2, "parent"):
        app.send_task("shop.child", ("o-1",))
    app.send_task("shop.child", ("o-2",))
    with app.connection_for_write() as connection:
        queue = connection.SimpleQueue("celery")
        try:
            first, second = queue.get(timeout=1), queue.get(timeout=1)
        finally:
            queue.close()
    assert first.headers[RETRY] == "2;parent"
    assert RETRY not in second.headers
    child = Delivery.read("shop.child", first.headers["id"], first.headers)
    assert child.inherited == fw.RetryMarker(2, "parent")


def test_dramatiq_publishes_the_ambient_marker_in_the_message_options() -> None:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from floodwall.dramatiq import OPTION, FloodwallMiddleware

    broker = StubBroker()
    broker.add_middleware(FloodwallMiddleware())
    broker.declare_queue("default")

    def send(order: str) -> Any:
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name="default", actor_name="child", args=(order,), kwargs={}, options={}
        )
        return broker.enqueue(message)

    with fw.retry_marker(3, "parent"):
        marked = send("o-1")
    plain = send("o-2")
    assert marked.options[OPTION] == {RETRY: "3;parent"}
    assert OPTION not in plain.options
    broker.close()


def test_celery_an_eager_task_refused_by_its_breaker_raises_instead_of_looping() -> None:
    from celery import Celery

    from floodwall.celery import GuardedTask, TaskGuard

    app = Celery("eager", broker="memory://")
    app.conf.task_always_eager = True
    breaker = fw.CircuitBreaker("payments")
    ran: list[str] = []

    @app.task(base=GuardedTask, guard=TaskGuard(breaker))  # type: ignore[untyped-decorator]
    def charge(order: str) -> str:
        ran.append(order)
        return order

    assert charge.delay("o-1").get() == "o-1"
    breaker.force_open()

    with pytest.raises(fw.CircuitOpenError):  # deferred on a worker; eager: raised
        charge.delay("o-2").get()
    assert ran == ["o-1"]


def test_dramatiq_a_guarded_actor_on_a_broker_without_the_middleware_is_refused() -> None:
    """Without ``FloodwallMiddleware`` the guarded actor found no current message and ran
    unguarded, silently: a redelivered message charged twice, an open breaker did not stop it,
    the guard counted nothing."""
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from floodwall.dramatiq import FloodwallMiddleware, TaskGuard, actor

    bare = StubBroker()
    with pytest.raises(fw.ConfigError, match=r"needs FloodwallMiddleware on the broker"):
        actor(lambda order: None, guard=TaskGuard(), broker=bare, actor_name="bare")
    assert "bare" not in bare.actors

    fitted = StubBroker()
    fitted.add_middleware(FloodwallMiddleware())
    breaker = fw.CircuitBreaker("payments")
    ran: list[str] = []

    def charge(order: str) -> None:
        ran.append(order)

    guard = TaskGuard(breaker)
    guarded = actor(charge, guard=guard, broker=fitted, actor_name="charge")
    breaker.force_open()
    worker = dramatiq.Worker(fitted, worker_timeout=100)
    worker.start()
    try:
        guarded.send("o-1")
        deadline = time.monotonic() + 10
        while guard.snapshot()["deferred"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop()
    assert ran == [] and guard.snapshot()["deferred"] == 1, "deferred, not run"
    fitted.close()
    bare.close()


def test_celery_a_guarded_task_refuses_autoretry_for_and_a_guard_that_is_not_one() -> None:
    """``GuardedTask`` switches Celery's ``max_retries`` off (a deferral must not use one up),
    so ``autoretry_for`` on it retried every failure without bound, past the guard's
    ``Retry(attempts=...)``; a policy given as ``guard`` failed each delivery with an
    ``AttributeError``. Both are refused when the task is built."""
    from celery import Celery

    from floodwall.celery import GuardedTask, TaskGuard

    app = Celery("checks", broker="memory://")

    def charge(order: str) -> str:
        return order

    storm = app.task(base=GuardedTask, guard=TaskGuard(), autoretry_for=(ConnectionError,))
    with pytest.raises(fw.ConfigError, match=r"autoretry_for.*without bound"):
        storm(charge).name  # noqa: B018 - building the task is the check
    wrong = app.task(base=GuardedTask, guard=fw.CircuitBreaker("payments"), name="wrong")
    with pytest.raises(fw.ConfigError, match=r"guard must be a TaskGuard, got <CircuitBreaker"):
        wrong(charge).name  # noqa: B018
    plain = app.task(base=GuardedTask, autoretry_for=(ConnectionError,), name="plain")
    assert plain(charge).name == "plain", "without a guard it is a plain Celery task"
