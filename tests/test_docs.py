"""Every ```python block of README.md and docs/**/*.md runs, and the site builds without warnings.

How a page runs: its blocks execute top to bottom in one namespace (a reader reads a page in
order, so a later block may use what an earlier one defined), in a fresh interpreter whose
working directory is a temporary one. Blocks are compiled with top-level ``await`` allowed (a
coroutine block runs on the page's event loop) and with postponed annotations, so a signature
may name a type the page leaves to the reader (``-> Receipt``). Tracebacks point at the
Markdown file and line.

Nothing runs that the reader cannot see: a sample pasted from the rendered page behaves as in
the suite. Stand-ins for the reader's own code (``legacy_client``, ``fetch_reviews``) are
written out in the sample; longer ones (a stand-in network, a throwaway database) live in a
file under ``docs/snippets/`` that the page shows with a block holding only
``--8<-- "docs/snippets/name.py"`` (pymdownx.snippets renders the file there; this test runs
the file at that point) and links to. A non-Python block titled with a file name
(```` ```yaml title="gateway.yaml" ````) is saved under that name in the working directory, as
the reader saves it, before the blocks after it run.

Two markers in the Markdown, both invisible on the rendered site:

* ``<!-- no-run: why -->`` on the line before a fence skips that block. Only for a block that
  needs a real server the test cannot start (a reason is required; keep them few).
* ``<!-- test-check`` … ``-->`` holds assertions run at that point of the page, never setup
  (prefer a visible ``assert`` in the sample). Hidden setup (``<!-- test-setup``) is refused.

Pages whose text mentions ``REDIS_URL`` get a throwaway Redis (``tests/servers.py``) in that
environment variable, and are integration tests; pages that mention ``METRICS_PORT`` get a free
loopback port in it (a sample's metrics endpoint must not collide with a running exporter).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import types
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from servers import free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGE_TIMEOUT = 60.0
"""Seconds one page's snippets may take in all (the suite's budget is < 60 s for every page)."""
MAX_NO_RUN = 8
"""Blocks allowed to opt out; raising it needs a reason in the commit."""

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*(?P<reason>\S.*?)\s*-->\s*$")
SETUP_OPEN = re.compile(r"^\s*<!--\s*test-check\s*$")
HIDDEN_SETUP = re.compile(r"<!--\s*test-setup")
MARKDOWN_LINK = re.compile(r"\]\((?P<target>[^)\s#]+)[^)\s]*\)")
SAVED_FILE = re.compile(r'title="(?P<name>[\w.-]+\.(?:ya?ml|toml|json|txt))"')
INCLUDE = re.compile(r'^\s*--8<--\s*"(?P<path>[^"]+)"\s*$')
SETUP_CLOSE = re.compile(r"^\s*-->\s*$")
FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | annotations.compiler_flag
"""Top-level ``await`` and postponed annotations (``from __future__ import annotations`` binds
``annotations`` to the feature, whose flag this is)."""


@dataclass(frozen=True)
class Snippet:
    """One block of Python in a Markdown file."""

    path: Path
    line: int
    """1-based line of the block's first code line."""
    code: str
    no_run: str | None = None
    hidden: bool = False
    info: str = ""
    """The fence's info string after the language (``title="app.py"``)."""
    included_by: Path | None = None
    """The page whose block includes this file (``--8<--``), for a snippet file."""
    saves: str | None = None
    """For a non-Python block titled with a file name: that name (the block is the file)."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _is_python(info: str) -> bool:
    words = info.strip().lstrip("{").replace(".", " ").split()
    return bool(words) and words[0] in ("python", "py")


def extract(path: Path) -> list[Snippet]:
    """The Python blocks and test-check blocks of ``path``, in document order; a block that
    only includes a file (``--8<-- "docs/snippets/x.py"``) is that file's code."""
    lines = path.read_text(encoding="utf-8").splitlines()
    snippets: list[Snippet] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if HIDDEN_SETUP.search(line):
            raise ValueError(
                f"{path}:{index + 1}: hidden setup: show it in the sample, or in a file under "
                "docs/snippets/ that the page includes (--8<--) and links to"
            )
        if SETUP_OPEN.match(line):
            end = index + 1
            while end < len(lines) and not SETUP_CLOSE.match(lines[end]):
                end += 1
            if end == len(lines):
                raise ValueError(f"{path}:{index + 1}: unclosed <!-- test-setup")
            body = textwrap.dedent("\n".join(lines[index + 1 : end]))
            snippets.append(Snippet(path, index + 2, body, hidden=True))
            index = end + 1
            continue
        opened = FENCE.match(line)
        if not opened:
            index += 1
            continue
        indent, fence = opened["indent"], opened["fence"]
        end = index + 1
        while end < len(lines):
            closing = FENCE.match(lines[end])
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            end += 1
        saves = SAVED_FILE.search(opened["info"])
        if saves and not _is_python(opened["info"]):
            body = "\n".join(_unindent(text, indent) for text in lines[index + 1 : end])
            snippets.append(Snippet(path, index + 2, body, hidden=True, saves=saves["name"]))
        elif _is_python(opened["info"]):
            body = "\n".join(_unindent(text, indent) for text in lines[index + 1 : end])
            info = opened["info"].strip()
            snippets.append(
                _included(Snippet(path, index + 2, body, _no_run(lines, index), info=info))
            )
        index = end + 1
    return snippets


def _included(snippet: Snippet) -> Snippet:
    """The file a block includes, in its place (tracebacks point at the file); else the block."""
    included = INCLUDE.match(snippet.code.strip())
    if included is None:
        return snippet
    target = ROOT / included["path"]
    code = target.read_text(encoding="utf-8").rstrip("\n")
    return Snippet(target, 1, code, snippet.no_run, info=snippet.info, included_by=snippet.path)


def includes(path: Path) -> list[Path]:
    """The files the Python blocks of ``path`` include."""
    return [s.path for s in extract(path) if s.included_by is not None]


def _unindent(text: str, indent: str) -> str:
    return text[len(indent) :] if text.startswith(indent) else text.lstrip()


def _no_run(lines: list[str], fence_index: int) -> str | None:
    before = fence_index - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    marker = NO_RUN.match(lines[before]) if before >= 0 else None
    return marker["reason"] if marker else None


def _mentions(path: Path, name: str) -> bool:
    return name in path.read_text(encoding="utf-8") or any(
        name in file.read_text(encoding="utf-8") for file in includes(path)
    )


def _needs_redis(path: Path) -> bool:
    return _mentions(path, "REDIS_URL")


# -- running one page (in its own interpreter: `python tests/test_docs.py PAGE`) -------------


def run_page(path: Path) -> int:
    """Run every block of ``path``; print one line per block; 1 on the first failure."""
    module = types.ModuleType("docs_page")
    module.__file__ = str(path)
    sys.modules["docs_page"] = module
    namespace = module.__dict__
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        for snippet in extract(path):
            if snippet.no_run is not None:
                print(f"skipped {snippet.where}: {snippet.no_run}")
                continue
            started = time.perf_counter()
            if snippet.saves is not None:
                Path(snippet.saves).write_text(snippet.code + "\n", encoding="utf-8")
                print(f"saved {snippet.saves} from {snippet.where}")
                continue
            try:
                _run(snippet, namespace, loop)
            except BaseException:
                print(f"FAILED {snippet.where}\n{snippet.code}\n", file=sys.stderr)
                traceback.print_exc()
                return 1
            kind = "check" if snippet.hidden else "ok"
            print(f"{kind} {snippet.where} ({time.perf_counter() - started:.2f}s)")
    finally:
        _close(loop)
    return 0


def _run(snippet: Snippet, namespace: dict[str, object], loop: asyncio.AbstractEventLoop) -> None:
    source = "\n" * (snippet.line - 1) + snippet.code + "\n"
    code = compile(source, str(snippet.path), "exec", flags=FLAGS, dont_inherit=True)
    if code.co_flags & inspect.CO_COROUTINE:
        loop.run_until_complete(eval(code, namespace))  # noqa: S307 - the docs' own code
    else:
        exec(code, namespace)  # noqa: S102 - the docs' own code


def _close(loop: asyncio.AbstractEventLoop) -> None:
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    with contextlib.suppress(BaseException):
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


# -- the tests --------------------------------------------------------------------------------


def _page_params() -> list[object]:
    params: list[object] = []
    for path in pages():
        if not any(not s.hidden for s in extract(path)):
            continue
        name = str(path.relative_to(ROOT))
        marks: list[pytest.MarkDecorator] = []
        if _needs_redis(path):
            marks.append(pytest.mark.integration)
        params.append(pytest.param(path, id=name, marks=marks))
    return params


@pytest.mark.parametrize("page", _page_params())
def test_page_snippets_run(page: Path, request: pytest.FixtureRequest) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), FLOODWALL_REPO=str(ROOT))
    env.pop("PYTEST_CURRENT_TEST", None)
    if _needs_redis(page):
        # an empty database: the install-line test runs the same page on this worker's server
        # (its job ids and idempotency keys would answer as replays here)
        request.getfixturevalue("redis_client")
        env["REDIS_URL"] = str(request.getfixturevalue("redis_url"))
    if _mentions(page, "METRICS_PORT"):
        env["METRICS_PORT"] = str(free_port())
    with tempfile.TemporaryDirectory(prefix="floodwall-docs-") as workdir:
        result = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(page)],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=PAGE_TIMEOUT,
            check=False,
        )
    assert result.returncode == 0, f"{page.relative_to(ROOT)}:\n{result.stdout}{result.stderr}"


def test_snippets_found_and_opt_outs_are_few() -> None:
    every = [s for path in pages() for s in extract(path) if not s.hidden]
    skipped = [s for s in every if s.no_run is not None]
    assert len(every) >= 40, f"only {len(every)} python blocks found: is the extractor broken?"
    assert len(skipped) <= MAX_NO_RUN, "\n".join(f"{s.where}: {s.no_run}" for s in skipped)


def test_extractor_reads_fences_markers_and_setup(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        textwrap.dedent(
            """\
            # A page

            ```python
            x = 1
            ```

            <!-- test-check
            y = 2
            -->

            * in a list:

              ```python title="indented"
              z = x + y
              ```

            ````markdown
            ```python
            not_python_here = True
            ```
            ````

            <!-- no-run: talks to a real server -->
            ```py
            connect()
            ```

            ```bash
            echo no
            ```
            """
        ),
        encoding="utf-8",
    )
    found = extract(page)
    assert [(s.line, s.code, s.hidden, s.no_run) for s in found] == [
        (4, "x = 1", False, None),
        (8, "y = 2", True, None),
        (14, "z = x + y", False, None),
        (25, "connect()", False, "talks to a real server"),
    ]


def test_hidden_setup_is_refused_and_an_include_runs_its_file(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n<!-- test-setup\nx = 2\n-->\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"page.md:5: hidden setup"):
        extract(page)
    snippet = DOCS / "snippets" / "flaky.py"
    page.write_text(
        '```python title="docs/snippets/flaky.py"\n--8<-- "docs/snippets/flaky.py"\n```\n\n'
        '```yaml title="app.yaml"\nresources: {}\n```\n',
        encoding="utf-8",
    )
    found, saved = extract(page)
    assert (found.path, found.line, found.included_by) == (snippet, 1, page)
    assert found.code == snippet.read_text(encoding="utf-8").rstrip("\n")
    assert (saved.saves, saved.code, saved.line) == ("app.yaml", "resources: {}", 6)


def test_no_page_hides_setup_and_every_included_file_is_linked() -> None:
    """Every included file is one a reader can open: the page links to it."""
    for page in pages():
        text = page.read_text(encoding="utf-8")
        assert not HIDDEN_SETUP.search(text), page
        for included in includes(page):
            links = {(page.parent / target).resolve() for target in MARKDOWN_LINK.findall(text)}
            assert included in links, f"{page.relative_to(ROOT)} includes {included} unlinked"


def test_docstrings_link_to_their_guide_not_to_an_unshown_module_docstring() -> None:
    """The API reference shows classes and functions, not module docstrings: a docstring that
    sends the reader to "the module docstring" sends them nowhere on the site. They link to the
    guide instead (``[Retries][guide-retries]``; the site build fails on an unknown target)."""
    sources = sorted((ROOT / "src").rglob("*.py"))
    pointing = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"module\s+docstring", line)
    ]
    assert not pointing, pointing
    guides = {
        match
        for path in sources
        for match in re.findall(r"\]\[(guide-[a-z-]+)\]", path.read_text(encoding="utf-8"))
    }
    defined = {
        match
        for page in pages()
        for match in re.findall(r"\{ #(guide-[a-z-]+) \}", page.read_text())
    }
    assert guides and guides <= defined, guides - defined


def test_a_failing_snippet_points_at_its_markdown_line(tmp_path: Path) -> None:
    page = tmp_path / "broken.md"
    page.write_text("text\n\n```python\nvalue = 1\nawait undefined_name()\n```\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(page)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT,
        check=False,
    )
    assert result.returncode == 1
    assert f'File "{page}", line 5' in result.stderr
    assert "NameError" in result.stderr


def _http(method: str, url: str) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method)  # noqa: S310 - loopback http only
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback
        return int(response.status), response.read().decode()


@pytest.mark.integration
def test_getting_started_app_runs_under_uvicorn_and_shows_its_metrics(tmp_path: Path) -> None:
    """The walk-through as a person does it: save app.py, run uvicorn, break the dependency,
    read /metrics."""
    page = DOCS / "getting-started.md"
    (app,) = [s for s in extract(page) if 'title="app.py"' in s.info]
    (tmp_path / "app.py").write_text(app.code + "\n", encoding="utf-8")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                status, body = _http("GET", f"{base}/price/sku-1")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert (status, body) == (200, '{"sku":"sku-1","price":9.99}')
        _http("POST", f"{base}/chaos?down=true")
        answers = [_http("GET", f"{base}/price/sku-1")[1] for _ in range(8)]
        assert set(answers) == {'{"price":null,"stale":true}'}
        _, scrape = _http("GET", f"{base}/metrics")
        assert 'floodwall_circuit_breaker_state{resource="prices",state="open"} 1.0' in scrape
        assert 'floodwall_circuit_breaker_state{resource="prices",state="closed"} 0.0' in scrape
        assert 'floodwall_fallbacks_total{resource="prices"} 8.0' in scrape
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)


def test_site_builds_without_warnings(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, a missing page or a docstring the API
    reference cannot render fails the build."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail("mkdocs is not installed in this venv: pip install -e '.[docs]'")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=900,  # a bound on a hung build, not a speed check (it takes 30-90 s)
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (tmp_path / "site" / "getting-started" / "index.html").is_file()
    reference = {
        page.parent.name: re.sub(r"<[^>]+>", "", page.read_text())
        for page in (tmp_path / "site" / "reference").glob("*/index.html")
    }
    named = [name for name, text in reference.items() if re.search(r"= defaults\.[A-Z]", text)]
    assert not named, f"signatures show defaults.NAME instead of its value: {named}"
    assert "attempts: int = 3," in reference["retries"], "Retry(attempts=...) shows no value"


if __name__ == "__main__":
    sys.exit(run_page(Path(sys.argv[1]).resolve()))


def test_readme_links_resolve_on_pypi_too() -> None:
    """README.md is the package's long description, and PyPI resolves no relative link: every
    link is absolute, and one into this repository names a file that exists."""
    import tomllib

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    repository = urls["Source"].rstrip("/")
    targets = MARKDOWN_LINK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert targets
    for target in targets:
        assert target.startswith(("https://", "#")), f"relative link in README.md: {target}"
        for kind in ("blob", "tree"):
            prefix = f"{repository}/{kind}/main/"
            if target.startswith(prefix):
                path = target.removeprefix(prefix).split("#")[0]
                assert (ROOT / path).exists(), f"README.md links to a missing file: {target}"
