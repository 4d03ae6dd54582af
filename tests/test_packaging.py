"""The built distribution, as a user gets it: every documented install line, in a fresh venv.

Once per test session, a copy of the checkout (with a stray venv ``v/`` holding an absolute
symlink, which an sdist that packed "whatever .gitignore leaves" would choke on) is built with
``python -m build``: the sdist, then the wheel from the sdist, as a release is built.

Every ``pip install`` line of README.md and docs/ (found by :func:`documented_install_lines`;
one without an entry in :data:`SAMPLES` fails the suite) is installed into a fresh ``python -m
venv`` with exactly that line, only the ``floodwall`` requirement pointed at the built wheel
(``'floodwall[redis]'`` -> ``'/tmp/…/floodwall-0.1.0-py3-none-any.whl[redis]'``), and the
page's sample then runs there from a directory outside the checkout, so only what that line
installed can be imported. Each distinct line is installed once (README and index share two),
three at a time; pip's cache keeps repeat runs fast. The clone variant of getting-started runs
its commands as printed in the unpacked sdist.

``import floodwall`` is timed in the fresh base and ``[all]`` venvs with ``-X importtime`` (best
of several runs) and reported; ``test_import_time_within_budget`` enforces the 50 ms budget.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
import tomllib
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from servers import free_port
from test_docs import Snippet, extract, pages

ROOT = Path(__file__).resolve().parent.parent
SERVER_CLIENTS = ("redis", "psycopg", "aiohttp", "grpc", "httpx", "pydantic", "yaml")
"""Client and framework libraries the base install must not bring."""
BASE_PACKAGES = {"floodwall", "pip", "setuptools", "wheel"}
IMPORT_BUDGET_MS = 50.0
IMPORT_RUNS = 7
INSTALL_TIMEOUT = 600
"""Seconds one ``pip install`` may take (a cold cache downloads grpcio, psycopg, …)."""
PARALLEL_INSTALLS = 3
"""pip spends most of an install waiting on the index and unpacking: three at once on 2 cores."""
SAMPLE_TIMEOUT = 300
"""Seconds a sample (or a smoke script) may take in a fresh venv; a busy 2-core machine needs
several times the idle figure (a few seconds)."""
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", "venv", "build", "dist", "__pycache__", "*.pyc", ".*_cache", ".hypothesis",
    "*.egg-info", "results", "site",
)  # fmt: skip

pytestmark = [
    pytest.mark.integration,
    pytest.mark.xdist_group("packaging"),
    # The first test of a line waits for its install (all lines install at once, three at a time):
    # bounded by pip's own timeout, not the suite's 120 s per test.
    pytest.mark.timeout(INSTALL_TIMEOUT + SAMPLE_TIMEOUT),
]

BASE = "pip install floodwall"
ALL = "pip install 'floodwall[all]'"
REDIS = "pip install 'floodwall[redis]'"
GATEWAY = "pip install 'floodwall[gateway,prometheus,cli]'"
CLONE = ".venv/bin/pip install -e '.[config,prometheus]' fastapi uvicorn httpx"


# -- the documented install lines and what runs after each ------------------------------------


@dataclass(frozen=True)
class Sample:
    """What a reader runs after the install line: the page's blocks, then checks."""

    blocks: Callable[[Snippet], bool] | None = None
    """Which of the page's python blocks run, in order (None: none of them)."""
    code: str = ""
    """Python run after the blocks, in the same namespace (asserts on what they made)."""
    commands: tuple[tuple[str, ...], ...] = ()
    """Console commands of the venv run afterwards (``{examples}``: the examples folder)."""
    needs: tuple[str, ...] = ()
    """Servers the sample talks to: ``redis`` (``REDIS_URL``), ``postgres`` (``DATABASE_URL``)."""
    serve_app: bool = False
    """Run the page's ``app.py`` under the venv's uvicorn and read it over loopback HTTP."""


def every(_: Snippet) -> bool:
    return True


SAMPLES: dict[tuple[str, str], Sample] = {
    ("README.md", BASE): Sample(every),
    ("README.md", ALL): Sample(
        every,
        commands=(
            ("floodwall", "--version"),
            ("floodwall", "check-config", "{examples}/floodwall.yaml"),
        ),
    ),
    ("docs/index.md", BASE): Sample(every),
    ("docs/index.md", ALL): Sample(every),
    ("docs/getting-started.md", "pip install 'floodwall[config,prometheus]' fastapi uvicorn httpx"):
        Sample(every, serve_app=True),
    ("docs/getting-started.md", CLONE): Sample(),  # its commands run as printed: see below
    ("docs/configuration.md", "pip install 'floodwall[config]'"): Sample(every),
    ("docs/recipes/fastapi-app.md",
     "pip install 'floodwall[config,prometheus,redis]' fastapi uvicorn httpx"):
        Sample(every, needs=("redis",)),
    ("docs/recipes/grpc-service.md", "pip install 'floodwall[grpc]'"): Sample(every),
    ("docs/distributed.md", REDIS): Sample(
        lambda snippet: "connect(REDIS_URL)" in snippet.code,
        code="store.ping()\nassert posts.allow('ann').allowed\nstore.close()",
        needs=("redis",),
    ),
    ("docs/distributed.md", "pip install 'floodwall[postgres]'"): Sample(
        code=(
            "import os\nfrom floodwall.stores import connect\n"
            "store = connect(os.environ['DATABASE_URL'])\nstore.ping()\nstore.close()"
        ),
        needs=("postgres",),
    ),
    ("docs/gateway.md", GATEWAY): Sample(
        every, commands=(("floodwall", "check-config", "{examples}/gateway.yaml"),)
    ),
    ("docs/task-queues.md", "pip install 'floodwall[celery]'"): Sample(
        code="import floodwall.celery\nassert floodwall.celery.GuardedTask.guard is None"
    ),
    ("docs/task-queues.md", "pip install 'floodwall[dramatiq]'"): Sample(
        code="import floodwall.dramatiq\nassert callable(floodwall.dramatiq.actor)"
    ),
    ("docs/task-queues.md", "pip install 'floodwall[arq]'"): Sample(
        code="import floodwall.arq\nassert callable(floodwall.arq.func)"
    ),
    ("docs/celery.md", "pip install 'floodwall[celery]'"): Sample(every, needs=("redis",)),
    ("docs/dramatiq.md", "pip install 'floodwall[dramatiq]'"): Sample(every),
    ("docs/arq.md", "pip install 'floodwall[arq]'"): Sample(every, needs=("redis",)),
    ("docs/django.md", "pip install 'floodwall[django,prometheus]'"): Sample(every),
}  # fmt: skip
"""Every documented install line, by page, and the sample that proves it enough."""

_FENCED = re.compile(r"^\s*(?P<cmd>(?:\S*/)?pip install\s.+)$")
_INLINE = re.compile(r"`(?P<cmd>(?:\S*/)?pip install\s[^`]+)`")


def _normal(command: str) -> str:
    """The command without its trailing comment, spaces collapsed."""
    return " ".join(re.sub(r"\s+#.*$", "", command).split())


def install_lines(text: str) -> list[str]:
    """The ``pip install`` commands of a Markdown text: inline code and command lines."""
    commands: list[str] = []
    for line in text.splitlines():
        inline = [m["cmd"] for m in _INLINE.finditer(line)]
        fenced = _FENCED.match(line)
        if not inline and fenced and "`" not in line:
            inline = [fenced["cmd"]]
        commands.extend(_normal(command) for command in inline)
    return commands


def documented_install_lines() -> list[tuple[str, str]]:
    """``(page, command)`` for every ``pip install`` in README.md and docs/, in page order."""
    found = [
        (str(path.relative_to(ROOT)), command)
        for path in pages()
        for command in install_lines(path.read_text(encoding="utf-8"))
    ]
    return list(dict.fromkeys(found))


# -- building once, installing once per distinct line -----------------------------------------


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path
    version: str
    tree: Path
    """The unpacked sdist."""


@dataclass(frozen=True)
class Venv:
    command: str
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def run(
        self,
        *args: str,
        cwd: Path,
        timeout: float = SAMPLE_TIMEOUT,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), *args],
            cwd=cwd,
            env={**_clean_env(self.path), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def tool(
        self, name: str, *args: str, cwd: Path, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.path / "bin" / name), *args],
            cwd=cwd,
            env={**_clean_env(self.path), **(env or {})},
            capture_output=True,
            text=True,
            timeout=SAMPLE_TIMEOUT,
            check=False,
        )

    def script(self, code: str, cwd: Path, *args: str) -> str:
        result = self.run("-c", textwrap.dedent(code), *args, cwd=cwd)
        assert result.returncode == 0, f"[{self.command}] smoke failed:\n{result.stderr}"
        return result.stdout


def _clean_env(venv: Path | None = None) -> dict[str, str]:
    """The environment without anything that would let the checkout leak into a fresh venv."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTEST_CURRENT_TEST")
    }
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def source_version() -> str:
    """``__version__`` of src/floodwall/__init__.py: the one place the version is written."""
    text = (ROOT / "src" / "floodwall" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "(?P<version>[^"]+)"$', text, re.MULTILINE)
    assert match, "src/floodwall/__init__.py has no __version__ line"
    return match["version"]


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """The sdist and the wheel built from it, once per session, from a copy of the checkout
    holding a stray venv with an absolute symlink."""
    work = tmp_path_factory.mktemp("dist")
    copy = work / "checkout"
    shutil.copytree(ROOT, copy, ignore=COPY_IGNORE, symlinks=True)
    (copy / "v" / "bin").mkdir(parents=True)
    (copy / "v" / "bin" / "python").symlink_to(sys.executable)
    out = work / "out"
    command = [sys.executable, "-m", "build", "--outdir", str(out)]
    if importlib.util.find_spec("hatchling") is not None:
        command.append("--no-isolation")  # this venv's hatchling: no download
    built = subprocess.run(
        [*command, str(copy)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
        env=_clean_env(),
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("floodwall-*.whl")
    (sdist,) = out.glob("floodwall-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(work, filter="data")
    (tree,) = work.glob("floodwall-*/")
    return Dist(wheel, sdist, source_version(), tree)


def pip_arguments(command: str, wheel: Path) -> list[str]:
    """``pip install`` arguments of ``command`` with the ``floodwall`` requirement pointed at the
    built wheel (extras kept); every other word exactly as printed."""
    words = shlex.split(command)
    assert words[:2] == ["pip", "install"], f"not a pip install line: {command}"
    pointed = [re.sub(r"^floodwall(?=\[|$)", str(wheel), word) for word in words[2:]]
    assert pointed != words[2:], f"{command!r} does not install floodwall"
    return pointed


@dataclass
class Installs:
    """A fresh venv per distinct install line, installed on first use (all of them started at
    once, a few in parallel), reused by every test of that line."""

    dist: Dist
    root: Path
    pool: concurrent.futures.ThreadPoolExecutor
    futures: dict[str, concurrent.futures.Future[Venv]] = field(default_factory=dict)

    def start(self, commands: list[str]) -> None:
        for command in commands:
            if command not in self.futures:
                self.futures[command] = self.pool.submit(self._install, command)

    def venv(self, command: str) -> Venv:
        self.start([command])
        return self.futures[command].result(timeout=INSTALL_TIMEOUT * 2)

    def _install(self, command: str) -> Venv:
        path = self.root / f"venv-{len(list(self.root.iterdir()))}-{time.monotonic_ns()}"
        subprocess.run(
            [sys.executable, "-m", "venv", str(path)],
            check=True,
            timeout=INSTALL_TIMEOUT,
            env=_clean_env(),
            capture_output=True,
        )
        venv = Venv(command, path)
        args = pip_arguments(command, self.dist.wheel)
        result = venv.run("-m", "pip", "install", *args, cwd=self.root, timeout=INSTALL_TIMEOUT)
        assert result.returncode == 0, f"{command}:\n{result.stdout}{result.stderr}"
        return venv


@pytest.fixture(scope="session")
def installs(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installs]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL_INSTALLS)
    installs = Installs(dist, tmp_path_factory.mktemp("venvs"), pool)
    installs.start([command for _, command in SAMPLES if command != CLONE])
    yield installs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory where the checkout's ``src/`` cannot be imported by accident."""
    return tmp_path


# -- the artifacts ----------------------------------------------------------------------------


def test_sdist_and_wheel_pass_twine_check(dist: Dist) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dist.wheel), str(dist.sdist)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_wheel_carries_the_package_data(dist: Dist) -> None:
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    assert "floodwall/py.typed" in names
    assert any(re.fullmatch(r"floodwall/stores/lua/[^/]+\.lua", n) for n in names)
    assert any(re.fullmatch(r"floodwall/stores/sql/postgresql/[^/]+\.sql", n) for n in names)
    assert not any(n.startswith(("tests/", "docs/", "benchmarks/")) for n in names)


def _listed() -> set[str]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        sdist = tomllib.load(file)["tool"]["hatch"]["build"]["targets"]["sdist"]
    return {str(Path(entry).parts[0]) for entry in sdist["only-include"]}


def test_sdist_holds_exactly_the_listed_files(dist: Dist) -> None:
    """The sdist is what pyproject.toml lists (the stray ``v/`` stays out), and everything the
    repository tracks is listed, so `make test` runs from the unpacked sdist."""
    with tarfile.open(dist.sdist) as archive:
        tops = {Path(name).parts[1] for name in archive.getnames() if len(Path(name).parts) > 1}
    assert tops - {"PKG-INFO", ".gitignore"} == _listed(), sorted(tops)
    assert (dist.tree / "tests" / "conftest.py").is_file()
    if (ROOT / ".git").exists():
        tracked = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        ).stdout.split()
        unlisted = {Path(name).parts[0] for name in tracked} - _listed() - {".gitignore"}
        assert not unlisted, f"tracked but not in the sdist's only-include list: {unlisted}"


def test_version_is_written_in_one_place(dist: Dist) -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert dist.wheel.name == f"floodwall-{dist.version}-py3-none-any.whl"
    assert dist.sdist.name == f"floodwall-{dist.version}.tar.gz"


# -- the base install and the extras ----------------------------------------------------------


def test_base_install_has_no_dependencies(installs: Installs, outside: Path) -> None:
    venv = installs.venv(BASE)
    listed = venv.run("-m", "pip", "list", "--format=json", cwd=outside)
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert installed <= BASE_PACKAGES, f"the base install pulled {installed - BASE_PACKAGES}"
    venv.script(
        """
        import asyncio, importlib.util, sys
        import floodwall as fw

        clock = fw.FakeClock()
        breaker = fw.CircuitBreaker("smoke", minimum_calls=2, clock=clock)
        protected = fw.Pipeline(fw.Fallback(value="fallback"), breaker, fw.Timeout(1.0))

        async def answer() -> str:
            return "async ok"

        assert protected.call(lambda: "ok") == "ok"
        assert asyncio.run(protected.call_async(answer)) == "async ok"
        assert protected.call(lambda: 1 / 0) == "fallback"
        assert protected.call(lambda: 1 / 0) == "fallback"
        assert breaker.state is fw.CircuitState.OPEN
        assert protected.call(lambda: "never called") == "fallback"
        clock.advance(5.0)
        assert protected.call(lambda: "probe") == "probe"
        assert breaker.state is fw.CircuitState.CLOSED
        leaked = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]
        assert not leaked, f"server client libraries importable: {leaked}"
        assert "floodwall" in fw.__file__ and "site-packages" in fw.__file__, fw.__file__
        print(fw.__version__)
        """,
        outside,
        *SERVER_CLIENTS,
    )


NEEDS_AN_EXTRA = {
    "floodwall.config": ("config", "pydantic"),
    "floodwall.httpx": ("httpx", "httpx"),
    "floodwall.aiohttp": ("aiohttp", "aiohttp"),
    "floodwall.requests": ("requests", "requests"),
    "floodwall.grpc": ("grpc", "grpc"),
    "floodwall.observe.prometheus": ("prometheus", "prometheus_client"),
    "floodwall.observe.otel": ("otel", "opentelemetry"),
    "floodwall.celery": ("celery", "celery"),
    "floodwall.dramatiq": ("dramatiq", "dramatiq"),
    "floodwall.arq": ("arq", "arq"),
    "floodwall.django": ("django", "django"),
}


def test_a_part_without_its_extra_names_the_extra(installs: Installs, outside: Path) -> None:
    """In the base install, each optional part fails with the extra to install; the
    framework-free ASGI and WSGI guards import."""
    printed = installs.venv(BASE).script(
        """
        import importlib, json, sys
        import floodwall.asgi, floodwall.wsgi
        said = {}
        for module in json.loads(sys.argv[1]):
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                said[module] = [str(exc), exc.name]
        print(json.dumps(said))
        """,
        outside,
        json.dumps(list(NEEDS_AN_EXTRA)),
    )
    said = json.loads(printed)
    for module, (extra, library) in NEEDS_AN_EXTRA.items():
        message, name = said[module]
        assert message == (
            f"{module} needs {library}, which is not installed: pip install 'floodwall[{extra}]'"
        )
        assert name.partition(".")[0] == library


def test_installed_version_is_the_project_version(
    installs: Installs, dist: Dist, outside: Path
) -> None:
    printed = installs.venv(BASE).script(
        "import floodwall, importlib.metadata as m; "
        "print(floodwall.__version__, m.version('floodwall'))",
        outside,
    )
    assert printed.split() == [dist.version, dist.version]


def test_redis_extra_talks_to_a_real_redis(
    installs: Installs, redis_url: str, outside: Path
) -> None:
    installs.venv(REDIS).script(
        """
        import importlib.util, sys
        from floodwall.shared.frequency import Frequency
        from floodwall.stores import connect

        store = connect(sys.argv[1], prefix="floodwall-packaging:")
        store.ping()
        once = Frequency.once(60, store=store, key=lambda user: user, name="smoke")
        assert once.allow("alice").allowed
        assert not once.allow("alice").allowed
        store.close()
        assert importlib.util.find_spec("psycopg") is None
        assert importlib.util.find_spec("aiohttp") is None
        """,
        outside,
        redis_url,
    )


def test_gateway_extra_imports_the_gateway(installs: Installs, outside: Path) -> None:
    installs.venv(GATEWAY).script(
        """
        import importlib, importlib.util
        import aiohttp, pydantic, yaml
        from floodwall.config import Registry, loads

        registry = Registry(loads("resources: {api: {timeout: 1s, circuit_breaker: {}}}", "x.yaml"))
        assert registry.get("api").call(lambda: 42) == 42
        if importlib.util.find_spec("floodwall.gateway") is not None:
            for module in ("config", "routing", "upstream", "proxy"):
                if importlib.util.find_spec(f"floodwall.gateway.{module}") is not None:
                    importlib.import_module(f"floodwall.gateway.{module}")
            from floodwall.gateway.config import parse_gateway_text
            parse_gateway_text(
                "upstreams: {app: {endpoints: ['http://127.0.0.1:9001']}}\\n"
                "routes: [{match: {path_prefix: /}, upstream: app}]\\n",
                "gateway.yaml",
            )
        """,
        outside,
    )


def test_all_extra_runs_the_command_line(installs: Installs, dist: Dist, outside: Path) -> None:
    venv = installs.venv(ALL)
    helped = venv.run("-m", "floodwall", "--help", cwd=outside)
    assert helped.returncode == 0, helped.stderr
    assert "check-config" in helped.stdout
    assert "Exit status" in helped.stdout
    version = venv.tool("floodwall", "version", cwd=outside)
    assert version.stdout.strip() == dist.version, version.stderr
    dashed = venv.tool("floodwall", "--version", cwd=outside)
    assert dashed.stdout.strip() == f"floodwall {dist.version}", dashed.stderr
    config = outside / "floodwall.yaml"
    config.write_text("resources: {payments: {level: 1, timeout: 2s, retry: {attempts: 2}}}\n")
    checked = venv.run("-m", "floodwall", "check-config", str(config), cwd=outside)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    venv.script(
        """
        import floodwall.observe.prometheus, floodwall.observe.otel, floodwall.stores.postgres
        import floodwall.adaptive.cpu
        for name in ("httpx", "aiohttp", "requests", "grpc", "asgi", "wsgi"):
            __import__(f"floodwall.{name}")
        """,
        outside,
    )


# -- every documented install line runs its page's sample ------------------------------------


def test_every_documented_install_line_has_a_sample() -> None:
    documented = documented_install_lines()
    assert len(documented) >= 10, f"only {len(documented)} install lines found: extractor broken?"
    missing = [line for line in documented if line not in SAMPLES]
    stale = [line for line in SAMPLES if line not in documented]
    assert not missing, f"install lines without a sample in SAMPLES: {missing}"
    assert not stale, f"SAMPLES names install lines no page prints any more: {stale}"


def test_install_lines_are_extracted_as_printed() -> None:
    text = (
        "Install: `pip install 'floodwall[grpc]'`, or see below.\n\n```bash\n"
        "pip install floodwall            # the core\n"
        ".venv/bin/pip install -e '.[config]' httpx\n```\n"
        "An error says `x needs y: pip install\n'floodwall[config]'`.\n"
    )
    assert install_lines(text) == [
        "pip install 'floodwall[grpc]'",
        "pip install floodwall",
        ".venv/bin/pip install -e '.[config]' httpx",
    ]
    wheel = Path("/w/floodwall-1.0-py3-none-any.whl")
    pointed = pip_arguments("pip install 'floodwall[a,b]' fastapi", wheel)
    assert pointed == [f"{wheel}[a,b]", "fastapi"]
    assert pip_arguments("pip install floodwall", wheel) == [str(wheel)]


_RUNNER = '''
"""Run a page's blocks as tests/test_docs.py does: in order, one namespace, top-level await."""
import __future__, ast, asyncio, inspect, json, sys, types

blocks, after = json.loads(open(sys.argv[1], encoding="utf-8").read())
module = types.ModuleType("docs_page")
sys.modules["docs_page"] = module
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)
flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | __future__.annotations.compiler_flag
for path, line, code in [*blocks, ["<checks>", 1, after]]:
    source = "\\n" * (line - 1) + code + "\\n"
    compiled = compile(source, path, "exec", flags=flags, dont_inherit=True)
    if compiled.co_flags & inspect.CO_COROUTINE:
        loop.run_until_complete(eval(compiled, module.__dict__))
    else:
        exec(compiled, module.__dict__)
print("ran", len(blocks), "blocks")
'''


def _sample_env(sample: Sample, request: pytest.FixtureRequest) -> dict[str, str]:
    env = {"FLOODWALL_REPO": str(ROOT)}
    if "redis" in sample.needs:
        # an empty database: tests/test_docs.py runs the same page on this worker's server
        request.getfixturevalue("redis_client")
        env["REDIS_URL"] = str(request.getfixturevalue("redis_url"))
    if "postgres" in sample.needs:
        env["DATABASE_URL"] = str(request.getfixturevalue("postgres_dsn"))
    return env


def _params() -> list[object]:
    return [
        pytest.param(page, command, id=f"{page}: {command}")
        for page, command in SAMPLES
        if command != CLONE
    ]


@pytest.mark.parametrize(("page", "command"), _params())
def test_install_line_runs_its_page_sample(
    page: str, command: str, installs: Installs, outside: Path, request: pytest.FixtureRequest
) -> None:
    sample = SAMPLES[page, command]
    venv = installs.venv(command)
    env = _sample_env(sample, request)
    snippets = [s for s in extract(ROOT / page) if s.no_run is None]
    if sample.blocks is None:
        chosen: list[Snippet] = []
    elif sample.blocks is every:  # the whole page, hidden setup too, as the docs test runs it
        chosen = snippets
    else:  # a part of the page: its hidden setup belongs to other blocks
        chosen = [s for s in snippets if not s.hidden and sample.blocks(s)]
    for saved in chosen:  # a file the page shows (a titled yaml block) is saved, not run
        if saved.saves is not None:
            (outside / saved.saves).write_text(saved.code + "\n", encoding="utf-8")
    blocks = [(str(s.path), s.line, s.code) for s in chosen if s.saves is None]
    runner = outside / "run_blocks.py"
    runner.write_text(_RUNNER, encoding="utf-8")
    (outside / "blocks.json").write_text(json.dumps([blocks, sample.code]), encoding="utf-8")
    ran = venv.run(str(runner), "blocks.json", cwd=outside, timeout=SAMPLE_TIMEOUT, env=env)
    assert ran.returncode == 0, f"[{command}] {page}:\n{ran.stdout}{ran.stderr}"
    for argv in sample.commands:
        words = [word.format(examples=ROOT / "examples") for word in argv]
        done = venv.tool(*words, cwd=outside, env=env)
        assert done.returncode == 0, f"[{command}] {' '.join(words)}:\n{done.stdout}{done.stderr}"
    if sample.serve_app:
        _serve_app(venv, page, outside)


def _http(method: str, url: str) -> tuple[int, str]:
    request = urllib.request.Request(url, method=method)  # noqa: S310 - loopback http only
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback
        return int(response.status), response.read().decode()


def _serve_app(venv: Venv, page: str, cwd: Path) -> None:
    """The page's ``app.py`` under the venv's own uvicorn, as the page runs it."""
    (app,) = [s for s in extract(ROOT / page) if 'title="app.py"' in s.info]
    (cwd / "app.py").write_text(app.code + "\n", encoding="utf-8")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(venv.path / "bin" / "uvicorn"), "app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=cwd,
        env=_clean_env(venv.path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
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
        answers = {_http("GET", f"{base}/price/sku-1")[1] for _ in range(8)}
        assert answers == {'{"price":null,"stale":true}'}
        _, scrape = _http("GET", f"{base}/metrics")
        assert "floodwall_" in scrape
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)


def test_getting_started_from_a_clone(dist: Dist, tmp_path: Path) -> None:
    """The page's clone commands as printed, after its ``git clone … && cd floodwall`` (here:
    the unpacked sdist, which is what a tagged clone holds)."""
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", text, re.DOTALL) if "git clone" in b]
    lines = block.strip().splitlines()
    assert lines[0].startswith("git clone ") and lines[0].endswith("&& cd floodwall"), lines[0]
    assert _normal(lines[2]) == CLONE
    clone = tmp_path / "floodwall"
    shutil.copytree(dist.tree, clone, symlinks=True)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(lines[1:])],
        cwd=clone,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == dist.version


# -- import cost ------------------------------------------------------------------------------

_IMPORTTIME = re.compile(r"^import time:\s+\d+\s+\|\s+(\d+)\s+\|\s+floodwall$", re.MULTILINE)


def import_ms(venv: Venv, cwd: Path, runs: int = IMPORT_RUNS) -> float:
    """Best cumulative ``import floodwall`` time over ``runs`` fresh interpreters, in ms."""
    best = float("inf")
    for _ in range(runs):
        result = venv.run("-X", "importtime", "-c", "import floodwall", cwd=cwd)
        assert result.returncode == 0, result.stderr
        match = _IMPORTTIME.search(result.stderr)
        assert match, result.stderr[-2000:]
        best = min(best, int(match.group(1)) / 1000)
    return best


def test_import_time_is_measured(
    installs: Installs, outside: Path, record_property: Callable[[str, object], None]
) -> None:
    """Reports ``import floodwall`` in fresh venvs; the budget is checked by the test below."""
    for command in (BASE, ALL):
        ms = import_ms(installs.venv(command), outside)
        record_property(f"import_floodwall_ms[{command}]", round(ms, 1))
        print(f"import floodwall [{command}]: {ms:.1f} ms (budget {IMPORT_BUDGET_MS} ms)")
        assert ms > 0


def test_import_time_within_budget(installs: Installs, outside: Path) -> None:
    for command in (BASE, ALL):
        ms = import_ms(installs.venv(command), outside)
        assert ms <= IMPORT_BUDGET_MS, (
            f"`import floodwall` takes {ms:.1f} ms in a fresh venv after `{command}` "
            f"(best of {IMPORT_RUNS}); the budget is {IMPORT_BUDGET_MS:.0f} ms. "
            "`python -X importtime -c 'import floodwall'` shows which modules cost it."
        )
