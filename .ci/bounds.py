"""Which dependency upper bounds keep out a newer release (run with an installed floodwall).

floodwall bounds a dependency from above only where it uses more than its documented API (see
the comment over ``[project.optional-dependencies]``). CI installs into a fresh venv, so it
tests the newest versions the bounds allow; this prints them, and says when the package index
has a newer release that a bound keeps out, so the bound is raised after testing it instead of
silently lagging. It asks the index once per bounded package; a failed look-up is reported and
does not fail the run.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

_BOUND = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(?P<spec>[^;]*)")


def bounded(requirements: list[str]) -> dict[str, str]:
    """``{package: specifier}`` for the requirements with an upper bound (``<``)."""
    found: dict[str, str] = {}
    for requirement in requirements:
        match = _BOUND.match(requirement)
        if match and "<" in match["spec"] and match["name"].lower() != "floodwall":
            found[match["name"].lower()] = match["spec"].strip()
    return found


def newest(name: str) -> str | None:
    """The newest release of ``name`` on the configured index (``pip index versions``)."""
    result = subprocess.run(  # noqa: S603 - this interpreter's pip, a package name from metadata
        [sys.executable, "-m", "pip", "index", "versions", name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    listed = re.compile(rf"^{re.escape(name)} \((?P<version>[^)]+)\)", re.IGNORECASE | re.MULTILINE)
    match = listed.search(result.stdout)
    return match["version"] if match else None


def keeps_out(spec: str, version: str) -> bool:
    """Whether ``spec``'s upper bound (``<X``) excludes ``version`` (release numbers only)."""
    ceiling = re.search(r"<\s*(?P<v>[\w.]+)", spec)
    return ceiling is not None and _key(version) >= _key(ceiling["v"])


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def main() -> int:
    for name, spec in sorted(bounded(importlib.metadata.requires("floodwall") or []).items()):
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "not installed"
        latest = newest(name)
        line = f"{name} {spec}: installed {installed}, newest {latest or '(look-up failed)'}"
        if latest and keeps_out(spec, latest):
            line += f" -- WARNING: the bound keeps {latest} out: test it, then raise the bound"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
