"""Release engineering: the changelog's form, the CI wiring of ``make release-check``, its
scripts, and the report on dependency upper bounds."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
"""Keep a Changelog 1.1.0's kinds of change."""
RELEASED = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+(?:[-.]\w+)?)\] - \d{4}-\d{2}-\d{2}$")


def test_changelog_is_in_keep_a_changelog_form() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "# Changelog"
    releases = [line for line in lines if line.startswith("## ")]
    assert releases, "no release section"
    assert releases[0] == "## [Unreleased]", releases[0]
    for heading in releases[1:]:
        assert RELEASED.match(heading), f"not '## [X.Y.Z] - YYYY-MM-DD': {heading}"
    kinds = {line[4:].strip() for line in lines if line.startswith("### ")}
    assert kinds <= SECTIONS, f"not a Keep a Changelog section: {kinds - SECTIONS}"
    for name in re.findall(r"^## \[([^\]]+)\]", text, re.MULTILINE):
        assert re.search(rf"^\[{re.escape(name)}\]: https://\S+$", text, re.MULTILINE), (
            f"no link for [{name}]"
        )


def test_the_version_is_unreleased_or_has_its_section() -> None:
    from floodwall import __version__

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = [m["version"] for m in map(RELEASED.match, text.splitlines()) if m]
    assert __version__ not in versions[1:], "an older section carries the current version"
    assert "## [Unreleased]" in text or (versions and versions[0] == __version__)


def test_ci_runs_release_check_which_runs_the_suite_once() -> None:
    run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [
        line.strip() for line in run.splitlines() if line.strip() and not line.startswith("#")
    ]
    assert commands[-1] == "make release-check"
    assert "make test" not in commands, "the suite would run twice"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^release-check:\n\t\.ci/release-check$", makefile, re.MULTILINE)
    script = (ROOT / ".ci" / "release-check").read_text(encoding="utf-8")
    for step in ("-m build", "twine check --strict", "run test", "bounds.py"):
        assert step in script, step


def test_ci_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    # .ci/run installs shellcheck: a missing linter is a broken setup, not a pass.
    assert shellcheck is not None, "shellcheck is not installed (apt-get install shellcheck)"
    scripts = [ROOT / ".ci" / "run", ROOT / ".ci" / "release-check"]
    for script in scripts:
        assert script.stat().st_mode & 0o111, f"{script} is not executable"
    result = subprocess.run(
        [shellcheck, *map(str, scripts)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _bounds() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_bounds", ROOT / ".ci" / "bounds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ci_bounds"] = module
    spec.loader.exec_module(module)
    return module


def test_bounds_report_reads_upper_bounds_and_what_they_keep_out() -> None:
    bounds = _bounds()
    requirements = [
        "aiohttp<3.15,>=3.12; extra == 'gateway'",
        "redis>=5.0; extra == 'redis'",
        "psycopg[binary]>=3.1; extra == 'postgres'",
        "pydantic<3,>=2.5; extra == 'config'",
        "floodwall[config]; extra == 'cli'",
    ]
    assert bounds.bounded(requirements) == {"aiohttp": "<3.15,>=3.12", "pydantic": "<3,>=2.5"}
    assert bounds.keeps_out("<3.15,>=3.12", "3.15.0")
    assert bounds.keeps_out("<3.15,>=3.12", "3.16.1")
    assert not bounds.keeps_out("<3.15,>=3.12", "3.14.5")
    assert bounds.keeps_out("<3,>=2.5", "3.0.0")
    assert not bounds.keeps_out("<3,>=2.5", "2.99.1")
    assert not bounds.keeps_out(">=5.0", "9.0")


def test_pyproject_bounds_are_the_ones_the_comment_names() -> None:
    import tomllib

    with (ROOT / "pyproject.toml").open("rb") as file:
        extras = tomllib.load(file)["project"]["optional-dependencies"]
    runtime = {k: v for k, v in extras.items() if k not in ("dev", "docs", "bench")}
    bounded = {
        re.split(r"[<>=\[; ]", requirement)[0].lower()
        for requirements in runtime.values()
        for requirement in requirements
        if "<" in requirement.split(";")[0]
    }
    assert bounded == {"aiohttp", "requests", "pydantic"}


def test_xdist_groups_hold(tmp_path: Path) -> None:
    """``make test`` runs ``--dist loadgroup``: the tests of one ``xdist_group`` (the packaging
    tests, which share one build and its venvs) run in one worker. A pytest and pytest-xdist
    pair that silently ignores the marks would run them twice over."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")  # not the project's
    (tmp_path / "test_grouped.py").write_text(
        "import pytest\n"
        "pytestmark = pytest.mark.xdist_group('one')\n"
        + "".join(f"def test_{n}():\n    pass\n" for n in range(6)),
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
         "loadgroup", "-v", "-c", str(tmp_path / "pytest.ini"), "test_grouped.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    ran = re.findall(r"^\[(gw\d+)\] .*PASSED (\S+)", result.stdout, re.MULTILINE)
    assert len(ran) == 6, result.stdout
    assert all(nodeid.endswith("@one") for _, nodeid in ran), result.stdout
    assert len({worker for worker, _ in ran}) == 1, result.stdout
