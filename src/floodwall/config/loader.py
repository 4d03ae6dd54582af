"""Reading a configuration document: parse, inherit, apply level rules, validate.

Order of precedence for every resource, weakest first: the built-in defaults of each policy, the
document's ``defaults`` section, the rules of the resource's dependency level, and the
resource's own keys. Sections merge key by key (a resource that sets only ``retry.attempts``
keeps the inherited backoff); ``false`` or ``null`` switches an inherited policy off.

A level rule is a bound in its level's direction, never a reset of what the user wrote: level 1
only asks for more evidence (a setting from ``defaults`` below the rule is raised to it), level 3
only makes a resource give up sooner (a setting above the rule is lowered to it). So
``defaults.circuit_breaker.minimum_calls: 5`` stays 5 on a level-3 resource (already earlier than
the rule's 10), and a ``null`` in ``defaults`` stays off.

Every error names the source, the path inside the document and the bad value::

    floodwall.yaml: resources.payments.retry.attempts: must be an integer >= 1, got 0
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from floodwall._core import validate
from floodwall._core.errors import ConfigError
from floodwall.config.schema import Document

__all__ = ["LEVEL_RULES", "inherit", "load", "parse"]

LEVEL_RULES: dict[int, dict[str, dict[str, Any]]] = {
    1: {
        # Critical: retry within the budget, break only on clear evidence.
        "circuit_breaker": {"minimum_calls": 40, "failure_rate": 0.6},
    },
    2: {},
    3: {
        # Optional: never retry, break early, give up fast.
        "retry": {"attempts": 1},
        "circuit_breaker": {"minimum_calls": 10, "failure_rate": 0.3},
    },
}
"""What a dependency level changes, applied over ``defaults`` and under the resource's own keys.

A level rule only touches a policy the resource has (inherited or its own), and only moves a
setting in its level's direction (see :mod:`floodwall.config.loader`)."""

_LEVEL_DIRECTION: dict[int, Callable[[float, float], float]] = {1: max, 3: min}
"""How a level's rule meets a value the user set in ``defaults``: level 1 raises it to the rule
(more calls and a higher failure rate before opening), level 3 lowers it (fewer attempts, an
earlier breaker). A key the user left unset takes the rule's value."""


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; nested mappings merge, anything else replaces."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _bounded(given: Any, bound: Any, level: int) -> Any:
    """The rule's ``bound`` applied to the user's ``given`` value, in the level's direction."""
    tighten = _LEVEL_DIRECTION.get(level)
    numbers = (int, float)
    if tighten is None or isinstance(given, bool) or not isinstance(given, numbers):
        return given  # an explicit null (off), or a bad value the schema will name
    return tighten(given, bound)


def _with_level(section: dict[str, Any], own: Mapping[str, Any], level: int) -> dict[str, Any]:
    """``section`` (from ``defaults``) with the level's rules, for each policy the resource has
    there or in its ``own`` keys (which are merged on top afterwards, and so beat the rule)."""
    rules = LEVEL_RULES.get(level, {})
    out = dict(section)
    for policy, rule in rules.items():
        current = out.get(policy)
        if not isinstance(current, Mapping) and isinstance(own.get(policy), Mapping):
            current = {}
        if isinstance(current, Mapping):
            merged = dict(current)
            for key, bound in rule.items():
                merged[key] = _bounded(current[key], bound, level) if key in current else bound
            out[policy] = merged
    return out


def inherit(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Apply inheritance (``defaults``) and level rules to a raw document (before validation)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"the document must be a mapping, got {type(raw).__name__}")
    inherited = raw.get("defaults") or {}
    if not isinstance(inherited, Mapping):
        raise ConfigError(f"defaults: must be a mapping, got {inherited!r}")
    resources = raw.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ConfigError(f"resources: must be a mapping, got {resources!r}")
    resolved: dict[str, Any] = {}
    for name, given in resources.items():
        own = given or {}
        if not isinstance(own, Mapping):
            raise ConfigError(f"resources.{name}: must be a mapping, got {own!r}")
        level = own.get("level", inherited.get("level", 2))
        section = _with_level(_merge({}, inherited), own, level if isinstance(level, int) else 2)
        resolved[name] = _merge(section, own)
    return {**raw, "resources": resolved}


def _path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not item.startswith(("function-", "constrained-")):
            parts.append(("." if parts else "") + item)
    return "".join(parts)


def _explain(error: ValidationError, source: str) -> ConfigError:
    lines = []
    for item in error.errors(include_url=False):
        message = item["msg"].removeprefix("Value error, ")
        loc = item["loc"]
        named = f"{loc[-1]} must " if loc and isinstance(loc[-1], str) else ""
        if named and message.startswith(named):  # an option's own check: the path names it
            message = message[len(named) - len("must ") :]
        got = item.get("input")
        shown = "" if isinstance(got, dict) or "got " in message else f" (got {got!r})"
        lines.append(f"{source}: {_path(loc)}: {message}{shown}")
    return ConfigError("\n".join(lines))


def parse(raw: Mapping[str, Any], source: str = "<config>") -> Document:
    """Validate a raw mapping (already loaded from YAML/TOML/JSON) into a :class:`Document`."""
    validate.text("source", source)
    try:
        resolved = inherit(raw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        document = Document.model_validate(resolved)
    except ValidationError as exc:
        raise _explain(exc, source) from None
    return document


def load(path: str | Path) -> Document:
    """Read and validate a YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON file."""
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"path must be a file path, got {path!r}")
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the file: {exc.strerror}") from exc
    return parse(loads(text, source), source)


def loads(text: str, source: str = "<config>") -> dict[str, Any]:
    """Parse the text of a document by the source's extension (YAML when unknown)."""
    validate.text("text", text, empty=True)
    validate.text("source", source)
    try:
        if source.endswith(".toml"):
            data: Any = tomllib.loads(text)
        elif source.endswith(".json"):
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{source}: not a valid document: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the document must be a mapping, got {type(data).__name__}")
    return data
