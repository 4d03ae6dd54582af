"""An HTTP/1.1 endpoint process that fails on a signal, for the endpoint-fault comparisons.

    python benchmarks/fault_endpoint.py PORT KIND LOG

Answers every request on keep-alive connections: ``/big`` with a 256 KiB body, ``/small`` with
1 KiB, anything else with 200 bytes. ``SIGUSR1`` switches its fault ``KIND`` on, ``SIGUSR2`` off:

* ``slow``: each answer 300 ms late;
* ``stall-big`` / ``stall-small``: the head and the first bytes of the body at once (16 KiB of
  ``/big``, 100 bytes otherwise), then nothing for 30 s;
* ``reset``: the connection reset (``SO_LINGER`` 0) once a request was read;
* any other kind (``frozen``, ``killed``): no fault of its own, the caller signals the process.

Each answered request's ``X-Drill-Request`` value (the drill's load numbers its requests) is
appended to ``LOG``, one a line, just before the answer is written, so a client that got
the answer finds it counted (``/health`` is not logged). A separate process so that
``SIGSTOP`` and ``SIGKILL`` are real.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import sys
from typing import TextIO

SIZES = {"/big": 256 * 1024, "/small": 1024}
STALL_AFTER = {"/big": 16 * 1024}
SLOW = 0.3
"""Seconds each answer waits while ``slow`` is on."""
STALL = 30.0
"""Seconds a stalled body waits before its connection is closed."""


class State:
    def __init__(self, kind: str, log: TextIO) -> None:
        self.kind = kind
        self.log = log
        self.faulty = False


class Endpoint(asyncio.Protocol):
    def __init__(self, state: State) -> None:
        self.state = state
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            task = asyncio.ensure_future(self.answer(head))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def answer(self, head: bytes) -> None:
        transport = self.transport
        assert transport is not None
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1] if " " in lines[0] else "/"
        fields = {k.strip().lower(): v.strip() for k, _, v in (s.partition(":") for s in lines)}
        body = b"x" * SIZES.get(path, 200)
        start = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        state = self.state
        kind = state.kind if state.faulty else ""
        if kind == "reset":
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
            return
        if kind == "slow":
            await asyncio.sleep(SLOW)
        if kind.startswith("stall"):
            transport.write(start + body[: STALL_AFTER.get(path, 100)])
            await asyncio.sleep(STALL)
            transport.close()
            return
        if transport.is_closing():
            return
        if path != "/health":  # (logged first: whoever got the answer finds it counted)
            state.log.write(fields.get("x-drill-request", "-") + "\n")
        transport.write(start + body)


def switch(state: State, on: bool) -> None:
    state.faulty = on


async def main(port: int, kind: str, log: TextIO) -> None:
    state = State(kind, log)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, switch, state, True)
    loop.add_signal_handler(signal.SIGUSR2, switch, state, False)
    server = await loop.create_server(
        lambda: Endpoint(state), "127.0.0.1", port, reuse_address=True
    )
    await server.serve_forever()


if __name__ == "__main__":
    with open(sys.argv[3], "a", buffering=1, encoding="utf-8") as out:
        asyncio.run(main(int(sys.argv[1]), sys.argv[2], out))
