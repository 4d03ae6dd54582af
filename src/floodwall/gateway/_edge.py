"""The edge rules: what a parsed request head must satisfy before the proxy sees it.

llhttp, the server's parser, already refuses ambiguous framing, bad tokens, control characters,
oversized lines and duplicate ``Host``. These rules refuse what it lets through, each where
nginx or HAProxy (the stricter of the two) refuses it too:

* **version**: only HTTP/1.0 and HTTP/1.1. A request line without a version (HTTP/0.9) is a
  400; a well-formed but other version (``HTTP/2.0``) a 505. The refusal is written as
  HTTP/1.1, never echoed in the client's version.
* **Host**: an RFC 9110 ``host[:port]`` (:func:`~floodwall.gateway._headers.host_error`), checked
  before it routes anything or is copied into ``X-Forwarded-Host`` / ``Forwarded``; with an
  absolute-form target, ``Host`` must name the target's host and port, an absent or empty
  port being the scheme's default (RFC 9112 §3.2.2 makes the target win; a proxy that routes
  on one and forwards the other can be steered). An HTTP/1.1 request
  needs one unless its target is absolute (RFC 9112 §3.2). 400 otherwise.
* **target**: a fragment (``#``) is refused (400), as HAProxy does.
* **upgrade**: a WebSocket handshake without ``Sec-WebSocket-Key`` is refused (400), as HAProxy
  does (:func:`upgrade_refusal`, applied only to heads llhttp reports as upgrades).
* **head size**: the request line and every field (``name: value`` and CRLF each, as parsed)
  within ``max_head`` bytes, 431 past it. The per-line and count limits alone let
  ``max_headers × max_line`` bytes through (800 KiB by default); the server's protocol also
  stops a head that is still arriving once it is past the cap.
* **path parameters**: a segment that reads ``.`` or ``..`` once its ``;parameters`` are cut
  (``/api/..;/admin``, ``/api/.;x/admin``, also percent-encoded) is refused with 400 unless
  ``path_parameters: forward``: Tomcat, Jetty and Spring cut parameters before they resolve
  dot-segments, so the upstream would serve ``/admin`` for a request the gateway routed as
  ``/api/...``.

:meth:`EdgeRules.check` is pure (a parsed head in, a refusal or ``None`` out) and costs a few
comparisons per request: nothing is compiled or allocated on the common path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from floodwall.gateway._headers import host_error
from floodwall.gateway.config import EdgeConfig
from floodwall.gateway.routing import normalise_host

if TYPE_CHECKING:
    from floodwall.gateway._server import Request

__all__ = ["EdgeRefusal", "EdgeRules", "upgrade_refusal"]

_VERSIONS: Final = frozenset({"1.1", "1.0"})
GOOD_HOSTS: Final = 1024
"""Valid ``Host`` values remembered per configuration (beyond, each is checked every time)."""


@dataclass(frozen=True, slots=True)
class EdgeRefusal:
    """Why a request is answered at the edge: the status, a problem ``kind`` and a detail."""

    status: int
    kind: str
    detail: str


_NO_VERSION: Final = EdgeRefusal(400, "no_http_version", "the request line has no HTTP version")
_BAD_VERSION: Final = EdgeRefusal(
    505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are served"
)
_DOT_PARAMETERS: Final = EdgeRefusal(
    400, "bad_path", "a dot-segment with path parameters ('..;') in the path"
)


_FRAGMENT: Final = EdgeRefusal(400, "bad_target", "a fragment ('#') in the request target")
"""RFC 9112 §3.2: a request target has no fragment (HAProxy refuses it by default; an upstream
may read the path differently from the route that matched it)."""
_NO_HOST: Final = EdgeRefusal(400, "bad_host", "an HTTP/1.1 request without Host")
"""RFC 9112 §3.2: a server MUST answer 400 (nginx does; an absolute-form target names the host
and may go without, as nginx lets it)."""


class EdgeRules:
    """The rules of one configuration's ``edge`` section (see :mod:`floodwall.gateway._edge`)."""

    __slots__ = (
        "_good_hosts",
        "forward_parameters",
        "max_head",
        "server_header",
        "server_line",
        "too_large",
    )

    def __init__(self, config: EdgeConfig) -> None:
        self.max_head = config.max_head
        self.forward_parameters = config.path_parameters == "forward"
        self.server_header = config.server_header
        """The ``Server`` field of every answer; ``None``: none at all."""
        server = self.server_header
        self.server_line = f"Server: {server}\r\n" if server is not None else ""
        """That field's line as an answer's head has it (``""``: none)."""
        self.too_large = EdgeRefusal(
            431, "request_head_too_large", f"request head larger than {self.max_head} bytes"
        )
        self._good_hosts: set[str] = set()
        """``Host`` values already found valid: a set lookup instead of a regex per request
        (filled up to :data:`GOOD_HOSTS`; a reload starts a new one)."""

    def check(self, request: Request) -> EdgeRefusal | None:
        """The refusal for this request head, or ``None`` if it may go on to the proxy."""
        version = request.version
        if version not in _VERSIONS:
            return _NO_VERSION if version == "0.9" else _BAD_VERSION
        if request.head_size > self.max_head:
            return self.too_large
        host = request.headers.get("host")
        if host is None:
            if version == "1.1" and request.absolute is None:
                return _NO_HOST
        elif host not in self._good_hosts:
            why = host_error(host)
            if why is not None:
                return EdgeRefusal(400, "bad_host", why)
            if len(self._good_hosts) < GOOD_HOSTS:
                self._good_hosts.add(host)
        authority = request.absolute
        if authority is not None:
            refused = _absolute_form(request.scheme_of_target, authority, host)
            if refused is not None:
                return refused
        if "#" in request.target:
            return _FRAGMENT
        path = request.raw_path
        if (
            not self.forward_parameters
            and (";" in path or "%" in path)
            and _dot_parameters(request.path)
        ):
            return _DOT_PARAMETERS
        return None


_NO_WEBSOCKET_KEY: Final = EdgeRefusal(
    400, "bad_upgrade", "a WebSocket upgrade without Sec-WebSocket-Key"
)


def upgrade_refusal(request: Request) -> EdgeRefusal | None:
    """The refusal for a head that asks for an upgrade (``Connection: upgrade`` and an
    ``Upgrade`` field: llhttp reports those alone, so the common path never comes here), or
    ``None``. The gateway proxies no upgrade (the fields are dropped and the request served
    as plain HTTP, RFC 9110 §7.8), but a WebSocket handshake without its key is malformed
    (RFC 6455 §4.2.1: 400), as HAProxy answers it."""
    headers = request.headers
    tokens = {token.strip().lower() for token in headers.get("upgrade", "").split(",")}
    if "websocket" in tokens and "sec-websocket-key" not in headers:
        return _NO_WEBSOCKET_KEY
    return None


def _absolute_form(scheme: str, authority: str, host: str | None) -> EdgeRefusal | None:
    if scheme not in ("http", "https"):
        return EdgeRefusal(400, "bad_target", f"a request target of scheme {scheme!r}")
    why = host_error(authority)
    if why is not None:
        return EdgeRefusal(400, "bad_target", f"the request target's authority: {why}")
    if host is not None and (
        normalise_host(host) != normalise_host(authority)
        or _port(scheme, host) != _port(scheme, authority)
    ):
        return EdgeRefusal(400, "bad_host", "Host does not name the request target's authority")
    return None


_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def _port(scheme: str, authority: str) -> int:
    """``authority``'s port (checked digits), the scheme's default when it has none or an
    empty one (RFC 3986 §6.2.3): ``http://a:80/`` and ``Host: a`` name the same authority,
    ``http://a:8080/`` and ``Host: a`` do not (HAProxy refuses those, nginx forwards them)."""
    tail = authority.rpartition("]")[2] if authority.startswith("[") else authority
    digits = tail.rpartition(":")[2] if ":" in tail else ""
    return int(digits) if digits else _DEFAULT_PORTS[scheme]


def _dot_parameters(path: str) -> bool:
    """Whether a segment of ``path`` (decoded) is ``.`` or ``..`` once its parameters are cut."""
    if ";" not in path:
        return False
    for segment in path.split("/"):
        if ";" in segment and segment.partition(";")[0] in (".", ".."):
            return True
    return False
