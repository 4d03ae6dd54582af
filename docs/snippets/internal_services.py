"""Stand-in for the network of the integrations page.

The ``*.internal`` services are one loopback HTTP server, and their names resolve to it, so the
page's samples run unchanged over real sockets. ``seen`` records every request as the server
got it: ``(method, host, path, headers)``.
"""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

seen: list[tuple[str, str, str, dict[str, str]]] = []


class Services(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.answer(200, {"balance": 1250})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.answer(201, {"charge": "ch_1"})

    def answer(self, status: int, body: object) -> None:
        seen.append((self.command, self.headers["Host"], self.path, dict(self.headers)))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


services = ThreadingHTTPServer(("127.0.0.1", 0), Services)
threading.Thread(target=services.serve_forever, daemon=True).start()
resolve = socket.getaddrinfo


def resolve_internal(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    """``*.internal`` names resolve to the loopback server; every other name as usual."""
    if isinstance(host, str) and host.endswith(".internal"):
        return resolve("127.0.0.1", services.server_port, *args, **kwargs)
    return resolve(host, port, *args, **kwargs)


socket.getaddrinfo = resolve_internal
