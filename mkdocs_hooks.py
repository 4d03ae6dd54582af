"""mkdocs hooks for the floodwall site (see ``hooks:`` in mkdocs.yml).

Pages of features still being written (the gateway, drills) are listed in the nav ahead of
time; an entry whose file does not exist yet is dropped with a note in the build log instead of
failing the strict build. Once the file lands, the page appears without touching mkdocs.yml.

The package's docstrings use Sphinx roles (``:class:`~floodwall.Pipeline```), which the API
reference would show verbatim; they are rendered as plain code (``Pipeline``) instead.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.floodwall")

NavItem = str | dict[str, Any]

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
