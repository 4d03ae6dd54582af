"""mkdocs hooks for the floodwall site (see ``hooks:`` in mkdocs.yml).

Pages of features still being written (the gateway, drills) are listed in the nav ahead of
time; an entry whose file does not exist yet is dropped with a note in the build log instead of
failing the strict build. Once the file lands, the page appears without touching mkdocs.yml.

The package's docstrings use Sphinx roles (``:class:`~floodwall.Pipeline```), which the API
reference would show verbatim; they are rendered as plain code (``Pipeline``) instead.

Defaults live as named constants in ``floodwall._core.defaults``, so a signature's source reads
``attempts: int = defaults.RETRY_ATTEMPTS``; the reader wants the number. :class:`DefaultValues`
(a griffe extension, ``extensions:`` in mkdocs.yml) shows ``attempts: int = 3`` instead, for
parameters and attributes alike.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from pathlib import Path
from typing import Any

import griffe

log = logging.getLogger("mkdocs.hooks.floodwall")

NavItem = str | dict[str, Any]

DEFAULT = re.compile(r"\bdefaults\.([A-Z][A-Z0-9_]*)\b")
"""A named default in a signature's source (``defaults.RETRY_ATTEMPTS``)."""

ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def _present(items: list[NavItem], docs: Path) -> list[NavItem]:
    kept: list[NavItem] = []
    for item in items:
        if isinstance(item, str):
            if item.startswith(("http://", "https://")) or (docs / item).is_file():
                kept.append(item)
            else:
                log.info("nav: %s is not written yet; left out of this build", item)
            continue
        ((title, target),) = item.items()
        if isinstance(target, list):
            children = _present(target, docs)
            if children:
                kept.append({title: children})
        elif target.startswith(("http://", "https://")) or (docs / target).is_file():
            kept.append(item)
        else:
            log.info("nav: %s (%s) is not written yet; left out of this build", title, target)
    return kept


def on_config(config: Any) -> Any:
    """Drop nav entries whose page does not exist (yet)."""
    if config.nav:
        config.nav = _present(list(config.nav), Path(config.docs_dir))
    return config


def _role(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    """Sphinx roles in docstrings (``:class:`~a.B``` rendered as ``:class:<code>~a.B</code>``)
    become plain code: ``<code>B</code>``."""
    return ROLE.sub(_role, html)


def _defaults() -> Any:
    src = str(Path(__file__).resolve().parent / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return importlib.import_module("floodwall._core.defaults")


class DefaultValues(griffe.Extension):
    """Render ``defaults.NAME`` in signatures and attribute values as the constant's value."""

    def __init__(self) -> None:
        super().__init__()
        self.module = _defaults()

    def _value(self, match: re.Match[str]) -> str:
        name = match.group(1)
        if not hasattr(self.module, name):
            log.warning("defaults.%s is named in a signature but not defined", name)
            return match.group(0)
        return repr(getattr(self.module, name))

    def _render(self, source: str | griffe.Expr) -> str | griffe.Expr:
        text = str(source)
        return DEFAULT.sub(self._value, text) if DEFAULT.search(text) else source

    def on_function(self, *, func: griffe.Function, **_: Any) -> None:
        for parameter in func.parameters:
            if parameter.default is not None:
                parameter.default = self._render(parameter.default)

    def on_attribute(self, *, attr: griffe.Attribute, **_: Any) -> None:
        if attr.value is not None:
            attr.value = self._render(attr.value)
