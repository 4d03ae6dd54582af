"""What the PostgreSQL and SQLite stores share: tables, migrations, and applying a step.

Migrations are package data, ``floodwall/stores/sql/<dialect>/NNNN_name.sql``, applied in order
and recorded in ``floodwall_schema(version)``; each file is idempotent (``IF NOT EXISTS``), so
a half-applied upgrade can simply be run again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from floodwall._core.errors import ConfigError
from floodwall.stores.base import KEEP, Op, Record, Write

TABLES = {"kv": "floodwall_kv", "idempotency": "floodwall_idempotency"}
SCHEMA_TABLE = "floodwall_schema"
_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def table(op: Op[Any]) -> str:
    """The SQL table of ``op`` (an allow-listed name, safe to format into a statement)."""
    try:
        return TABLES[op.table]
    except KeyError:
        raise ConfigError(
            f"{op!r}.table must be one of {sorted(TABLES)}, got {op.table!r}"
        ) from None


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def _statements(text: str) -> tuple[str, ...]:
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    return tuple(part.strip() for part in "\n".join(lines).split(";") if part.strip())


@cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    """Every migration of ``dialect`` (``"postgresql"`` or ``"sqlite"``), oldest first."""
    folder = resources.files("floodwall.stores").joinpath("sql", dialect)
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), entry.name, _statements(entry.read_text())))
    return tuple(sorted(found, key=lambda m: m.version))


def records(
    keys: Sequence[str], rows: dict[str, tuple[bytes | None, float | None]], now: float
) -> list[Record | None]:
    """The live records for ``keys`` from ``{key: (value, expires_at)}`` rows (a NULL value is a
    lock placeholder, an expired row is absent)."""
    found: list[Record | None] = []
    for key in keys:
        row = rows.get(key)
        if row is None or row[0] is None:
            found.append(None)
            continue
        record = Record(bytes(row[0]), row[1])
        found.append(record if record.alive(now) else None)
    return found


def plan(
    keys: Sequence[str],
    rows: dict[str, tuple[bytes | None, float | None]],
    writes: Sequence[Write],
) -> tuple[list[tuple[bytes, float | None, str]], list[str]]:
    """Turn an op's writes into ``(upserts, deletes)``: upserts are ``(value, expires_at, key)``.

    ``KEEP`` on a lock placeholder deletes it, so ops that only read leave nothing behind.
    """
    if len(writes) != len(keys):
        raise ConfigError(f"an op returned {len(writes)} writes for {len(keys)} records")
    upserts: list[tuple[bytes, float | None, str]] = []
    deletes: list[str] = []
    for key, write in zip(keys, writes, strict=True):
        if isinstance(write, Record):
            upserts.append((write.value, write.expires_at, key))
        elif write is KEEP:
            row = rows.get(key)
            if row is not None and row[0] is None:
                deletes.append(key)
        else:
            deletes.append(key)
    return upserts, deletes
