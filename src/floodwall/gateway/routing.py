"""Which route answers a request: host, path (exact, prefix or regex), method and headers.

Routes are tried in the order of the file; the first whose every condition holds wins (as in
Envoy and Kong), so put specific routes before general ones. Matching is pure: a
:class:`Router` is built once per configuration and never changes; a reload builds a new one.

Hosts are compared without port, lower-cased and without a trailing dot; ``*.example.com``
matches any name ending in ``.example.com`` (not ``example.com`` itself). A request that no
route matches is answered 404 by the proxy: nothing but a configured upstream is ever reached.

Paths are matched on the percent-decoded path. A path the proxy refuses to route (see
:func:`unsafe_path`) never gets this far: dot-segments, empty segments and encoded slashes
would let ``/api/public/../admin`` match one route and mean another to the upstream.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from floodwall.gateway.config import MatchConfig

__all__ = ["Matcher", "Router", "normalise_host", "unsafe_path"]

T = TypeVar("T")

_EMPTY: dict[str, str] = {}
_BAD_ESCAPE = re.compile(r"%(?:2f|5c|00|(?![0-9a-f]{2}))", re.IGNORECASE)
"""An encoded ``/``, ``\\`` or NUL, or a ``%`` not followed by two hex digits."""


def normalise_host(host: str | None) -> str:
    """``"API.Example.com:8080"`` → ``"api.example.com"``; ``"[::1]:80"`` → ``"::1"``; an
    empty port (``"api.example.com:"``, RFC 3986 §3.2.3: the default one) goes too."""
    if not host:
        return ""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, colon, port = host.rpartition(":")
    if colon and (port.isdigit() or not port) and ":" not in name:
        host = name
    return host.rstrip(".")


def unsafe_path(path: str, raw_path: str) -> str | None:
    """Why ``path`` (decoded) / ``raw_path`` (as sent) cannot be routed safely, or ``None``:
    not starting with ``/``, dot-segments (``/./``, ``/../``, decoded ones too), empty segments
    (``//``), backslashes, NUL, encoded ``/``, ``\\`` or NUL (``%2F``, ``%5C``, ``%00``), or a
    ``%`` without two hex digits after it (``/a%``, ``/a%1``: nginx refuses it too, and each
    upstream would decode it its own way)."""
    if not path.startswith("/"):
        return "the path must start with '/'"
    if "//" in path:
        return "empty path segment ('//')"
    if "\\" in path or "\x00" in path:
        return "backslash or NUL in the path"
    if "/." in path:
        for segment in path.split("/"):
            if segment in (".", ".."):
                return "dot-segment in the path"
    if "%" in raw_path:  # (the query cut off only then: no split per request)
        raw = raw_path.split("?", 1)[0]
        found = _BAD_ESCAPE.search(raw) if "%" in raw else None
        if found is not None:
            if found.group().lower() in ("%2f", "%5c", "%00"):
                return "encoded '/', '\\' or NUL in the path"
            return "a '%' without two hex digits in the path"
    return None


@dataclass(frozen=True, slots=True)
class Matcher:
    """One route's compiled conditions (see :class:`~floodwall.gateway.config.MatchConfig`)."""

    hosts: frozenset[str]
    suffixes: tuple[str, ...]
    path: str | None
    prefix: str | None
    boundary: bool
    regex: re.Pattern[str] | None
    methods: frozenset[str] | None
    headers: tuple[tuple[str, str], ...]

    @classmethod
    def compile(cls, config: MatchConfig) -> Matcher:
        names = (config.host,) if isinstance(config.host, str) else (config.host or ())
        hosts = frozenset(normalise_host(h) for h in names if not h.startswith("*."))
        suffixes = tuple(normalise_host(h)[1:] for h in names if h.startswith("*."))
        prefix = config.path_prefix
        boundary = config.prefix_boundary
        if prefix is not None and boundary and prefix.endswith("/") and prefix != "/":
            prefix = prefix.rstrip("/")
        return cls(
            hosts=hosts,
            suffixes=suffixes,
            path=config.path,
            prefix=prefix,
            boundary=boundary,
            regex=re.compile(config.path_regex) if config.path_regex is not None else None,
            methods=frozenset(config.methods) if config.methods else None,
            headers=tuple((k.lower(), v) for k, v in config.headers.items()),
        )

    def host_ok(self, host: str) -> bool:
        if not self.hosts and not self.suffixes:
            return True
        if host in self.hosts:
            return True
        return any(host.endswith(suffix) for suffix in self.suffixes)

    def path_params(self, path: str) -> dict[str, str] | None:
        """``None`` when the path does not match, else its parameters (regex groups)."""
        if self.prefix is not None:
            prefix = self.prefix
            if not path.startswith(prefix):
                return None
            if (
                self.boundary
                and len(path) > len(prefix)
                and path[len(prefix)] != "/"
                and (prefix != "/")
            ):
                return None
            return _EMPTY
        if self.path is not None:
            return _EMPTY if path == self.path else None
        if self.regex is not None:
            found = self.regex.fullmatch(path)
            return None if found is None else {k: v for k, v in found.groupdict().items() if v}
        return _EMPTY

    def headers_ok(self, headers: Mapping[str, str]) -> bool:
        for name, wanted in self.headers:
            value = headers.get(name)
            if value is None or wanted not in ("*", value):
                return False
        return True


class Router(Generic[T]):
    """Routes in file order; :meth:`match` returns the first that matches, with its path
    parameters. O(routes) per request, each condition a set lookup or a string test."""

    __slots__ = ("_entries", "_first", "_first_prefix")

    def __init__(self, entries: Sequence[tuple[Matcher, T]]) -> None:
        self._entries = tuple(entries)
        self._first_prefix: str | None = None
        """The first route's path prefix when a path starting with it is all that route asks
        (no method, host or field condition, no segment boundary to check past ``/``): such a
        path is matched without the loop and its calls (the usual single catch-all route)."""
        self._first: tuple[T, dict[str, str]] | None = None
        if self._entries:
            matcher, target = self._entries[0]
            prefix = matcher.prefix
            if (
                prefix is not None
                and (not matcher.boundary or prefix == "/")
                and matcher.methods is None
                and not matcher.hosts
                and not matcher.suffixes
                and not matcher.headers
            ):
                self._first_prefix = prefix
                self._first = (target, _EMPTY)

    def match(
        self, method: str, host: str, path: str, headers: Mapping[str, str]
    ) -> tuple[T, dict[str, str]] | None:
        """The first route matching ``method``, ``host`` (normalised), ``path`` (decoded)
        and ``headers`` (case-insensitive mapping), or ``None``."""
        prefix = self._first_prefix
        if prefix is not None and path.startswith(prefix):
            return self._first
        for matcher, target in self._entries:
            methods = matcher.methods
            if methods is not None and method not in methods:
                continue
            if (matcher.hosts or matcher.suffixes) and not matcher.host_ok(host):
                continue  # (a route for any host: no call)
            params = matcher.path_params(path)
            if params is None:
                continue
            if matcher.headers and not matcher.headers_ok(headers):
                continue
            return target, params
        return None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def targets(self) -> list[T]:
        return [target for _, target in self._entries]
