"""A Redis store call is bounded as a whole, not per socket step.

A real redis-server sits behind a loopback proxy that holds every chunk the server sends for
``delay`` seconds (what the client sends passes at once): each round trip then takes ``delay``.
A store call that must reconnect (its pooled connection was dropped, as after a failed call)
makes at least two (the connection's handshake, one round trip with RESP2 and two with RESP3,
then the script), so with a delay of 0.6 x the timeout each
step is within redis-py's per-step bound but the call is not: the store must answer
``StoreTimeoutError`` within 1.2 x its timeout (plus the time a call takes through the proxy
without a delay, measured first), where per-step bounds alone answer after 1.2 x the timeout or
later. With a delay of 0.15 x the timeout the same call fits and succeeds: the budget is the
call's, not cut short. (A store's very first calls, before it has answered once, are bounded
step by step instead: a slow start is no outage.)
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from conftest import ONCE, once
from floodwall.stores import StoreTimeoutError
from floodwall.stores.redis import RedisStore

pytestmark = pytest.mark.integration

TIMEOUT = 0.5
HOST = "127.0.0.1"


class SlowProxy:
    """Forward loopback TCP to ``port``, holding what the server sends for ``delay`` seconds
    (each chunk in order, from when it arrived)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.delay = 0.0
        self._listener = socket.create_server((HOST, 0))
        self.address = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection((HOST, self.port))
            self._sockets += [client, server]
            held: queue.Queue[tuple[float, bytes]] = queue.Queue()
            threading.Thread(target=self._pass, args=(client, server), daemon=True).start()
            threading.Thread(target=self._hold, args=(server, held), daemon=True).start()
            threading.Thread(target=self._release, args=(held, client), daemon=True).start()

    @staticmethod
    def _pass(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _hold(self, source: socket.socket, held: queue.Queue[tuple[float, bytes]]) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                held.put((time.monotonic() + self.delay, chunk))
        held.put((0.0, b""))

    @staticmethod
    def _release(held: queue.Queue[tuple[float, bytes]], sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                due, chunk = held.get()
                if not chunk:
                    break
                time.sleep(max(0.0, due - time.monotonic()))
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[SlowProxy]:
    port = urlsplit(redis_url).port
    assert port is not None
    slow = SlowProxy(port)
    try:
        yield slow
    finally:
        slow.close()


def _reconnecting_call(proxy: SlowProxy, shell: str, delay: float) -> tuple[float, object]:
    """On a store that has answered (through the proxy without a delay), one op that must
    reconnect (its pool was dropped: handshake, then the script) with the proxy at ``delay``:
    how long it took and what it returned or raised."""
    store = RedisStore(
        f"redis://{HOST}:{proxy.address}/0", prefix=f"slow-{shell}:", timeout=TIMEOUT
    )
    proxy.delay = 0.0

    def timed(call: Callable[[], object]) -> tuple[float, object]:
        start = time.monotonic()
        result: object
        try:
            result = call()
        except StoreTimeoutError as exc:
            result = exc
        return time.monotonic() - start, result

    async def call_async() -> tuple[float, object]:
        try:
            await store.apply_async(ONCE, "k", once(1))
            await (await store.async_client()).connection_pool.disconnect()
            proxy.delay = delay
            start = time.monotonic()
            try:
                got = await store.apply_async(ONCE, "k", once(1))
            except StoreTimeoutError as exc:
                return time.monotonic() - start, exc
            return time.monotonic() - start, got
        finally:
            await store.aclose()

    try:
        if shell == "async":
            return asyncio.run(call_async())
        store.apply(ONCE, "k", once(1))
        store.client().connection_pool.disconnect()
        proxy.delay = delay
        return timed(lambda: store.apply(ONCE, "k", once(1)))
    finally:
        store.close()


@pytest.mark.parametrize("shell", ["sync", "async"])
def test_a_call_whose_steps_each_fit_but_not_together_times_out_within_its_bound(
    proxy: SlowProxy, shell: str
) -> None:
    baseline, answer = _reconnecting_call(proxy, shell, 0.0)
    assert not isinstance(answer, BaseException), answer
    fits, answer = _reconnecting_call(proxy, shell, 0.15 * TIMEOUT)
    assert not isinstance(answer, BaseException), ("steps of 0.15 x timeout fit", answer)
    took, answer = _reconnecting_call(proxy, shell, 0.6 * TIMEOUT)
    print(
        f"\nslow server ({shell}): healthy {1000 * baseline:.0f} ms, steps of 0.15 x timeout "
        f"{1000 * fits:.0f} ms, steps of 0.6 x timeout answered after {1000 * took:.0f} ms "
        f"({type(answer).__name__})"
    )
    assert isinstance(answer, StoreTimeoutError), answer
    assert took <= 1.2 * TIMEOUT + baseline, (took, baseline)
