"""Real HTTP and gRPC servers on loopback for the integration tests, each in a thread of its own.

Every server binds 127.0.0.1 on a port the kernel picks (the socket is bound before the server
starts, so there is no race for a free port), starts within ``START_TIMEOUT`` seconds, and is
stopped by the ``with`` block that started it::

    with Uvicorn(app) as server:
        httpx.get(server.url + "/hello")
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Literal, Self

HOST = "127.0.0.1"
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0


def bound_socket() -> socket.socket:
    """A listening-ready TCP socket on 127.0.0.1 with a kernel-picked port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock


def _wait(predicate: Callable[[], bool], what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {timeout}s")
        time.sleep(0.01)


class _Threaded:
    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class Uvicorn(_Threaded):
    """An ASGI app served by uvicorn (h11, asyncio loop) in a background thread."""

    def __init__(self, app: Any, *, lifespan: Literal["on", "off"] = "off") -> None:
        import uvicorn

        self._sock = bound_socket()
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan=lifespan,
            loop="asyncio",
            http="h11",
            proxy_headers=False,  # the guard reads X-Forwarded-For itself (trusted_proxies)
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self) -> Self:
        self._thread.start()
        _wait(lambda: self.server.started, "uvicorn")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(STOP_TIMEOUT)
        self._sock.close()


class WSGI(_Threaded):
    """A WSGI app served by the standard library's ``wsgiref`` (one thread per request)."""

    def __init__(self, app: Any) -> None:
        import socketserver
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Threading(socketserver.ThreadingMixIn, WSGIServer):
            daemon_threads = True

        self.server = make_server(HOST, 0, app, server_class=Threading, handler_class=Quiet)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(STOP_TIMEOUT)


class LoopThread:
    """An asyncio loop in a thread, for servers that must live in a loop of their own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = START_TIMEOUT) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STOP_TIMEOUT)
        self.loop.close()


class Aiohttp(_Threaded):
    """An ``aiohttp.web`` application in a loop thread."""

    def __init__(self, app: Any, *, shutdown_timeout: float = 60.0) -> None:
        self.app = app
        self.shutdown_timeout = shutdown_timeout
        """Seconds :meth:`stop` lets requests in flight finish (aiohttp's default: 60)."""
        self._loop = LoopThread()
        self._runner: Any = None
        self.port = 0

    def start(self) -> Self:
        from aiohttp import web

        async def up() -> None:
            self._runner = web.AppRunner(
                self.app, access_log=None, shutdown_timeout=self.shutdown_timeout
            )
            await self._runner.setup()
            sock = bound_socket()
            self.port = sock.getsockname()[1]
            await web.SockSite(self._runner, sock).start()

        self._loop.run(up())
        return self

    def stop(self) -> None:
        if self._runner is not None:
            self._loop.run(self._runner.cleanup())
            self._loop.run(_cancel_the_rest())  # handlers cut short by ``shutdown_timeout``
        self._loop.close()


async def _cancel_the_rest() -> None:
    """Cancel every other task of the running loop and wait for them to end."""
    me = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not me]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


class GrpcAio:
    """A ``grpc.aio`` server in a loop thread: ``build(server)`` adds the handlers."""

    def __init__(self, build: Callable[[Any], None], interceptors: tuple[Any, ...] = ()) -> None:
        self._build = build
        self._interceptors = interceptors
        self._loop = LoopThread()
        self._server: Any = None
        self.port = 0

    @property
    def target(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> Self:
        import grpc

        async def up() -> None:
            self._server = grpc.aio.server(interceptors=self._interceptors)
            self._build(self._server)
            self.port = self._server.add_insecure_port(f"{HOST}:0")
            await self._server.start()

        self._loop.run(up())
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._loop.run(self._server.stop(grace=None))
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
