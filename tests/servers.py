"""Throwaway Redis, Redis Cluster and PostgreSQL servers for the integration tests.

Plain helpers with no pytest dependency: ``tests/conftest.py`` wraps them in fixtures, and they
can be used by hand too::

    with RedisServer() as server:
        print(server.url)

Every server listens on 127.0.0.1 on a freshly picked free port (never 6379 or 5432, which a
developer machine may already use), lives in its own temporary directory, and is stopped by pid:
SIGTERM, then SIGKILL after a grace period. Every wait is bounded. Servers still running when the
interpreter exits are stopped by an ``atexit`` safety net.

A missing server binary raises ``RuntimeError`` naming the binary; nothing is skipped silently.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from floodwall.breaker import CircuitBreaker
from floodwall.stores import StoreUnavailableError

HOST = "127.0.0.1"
START_TIMEOUT = 10.0
"""Seconds a server gets to answer after it was launched."""
STOP_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL."""
POLL_INTERVAL = 0.02
START_ATTEMPTS = 3
"""Launch attempts: another process may grab a free-picked port before the server binds it."""
CLUSTER_BUS_OFFSET = 10000
CLUSTER_SLOTS = 16384
_CLUSTER_NODE_ARGS = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
PG_USER = "floodwall"
PG_DATABASE = "floodwall_test"

_INSTALL_HINT = (
    "`.ci/run` installs it with the Debian packages redis-server, redis-tools and postgresql "
    "(apt-get install redis-server redis-tools postgresql)"
)
_ADDRESS_IN_USE = re.compile(r"address already in use|could not bind", re.IGNORECASE)


class ServerStartError(RuntimeError):
    """A server did not come up in time; the message carries the tail of its log."""


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class _Server:
    """Context-manager plumbing and the registry behind the ``atexit`` safety net."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_RUNNING: dict[int, _Stoppable] = {}


def _register(server: _Stoppable) -> None:
    _RUNNING[id(server)] = server


def _unregister(server: _Stoppable) -> None:
    _RUNNING.pop(id(server), None)


@atexit.register
def stop_all() -> None:
    """Stop every server this process started and has not stopped yet."""
    for server in list(_RUNNING.values()):
        with contextlib.suppress(Exception):
            server.stop()
    _RUNNING.clear()


# --------------------------------------------------------------------------------------------
# Utilities
# --------------------------------------------------------------------------------------------

_HANDED_OUT: set[int] = set()


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether ``port`` can be bound on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(*, cluster_bus: bool = False, host: str = HOST, attempts: int = 200) -> int:
    """A currently free TCP port on ``host``: bind to port 0, read the port, close.

    With ``cluster_bus`` the port + 10000 (the Redis Cluster bus) must be free as well. One process
    never hands out a port twice, so servers started back to back cannot collide; a collision
    with another process (e.g. another xdist worker) is handled by the servers relaunching on a
    new port when theirs turns out to be taken.
    """
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port in _HANDED_OUT:
            continue
        if cluster_bus:
            bus = port + CLUSTER_BUS_OFFSET
            if bus > 65535 or bus in _HANDED_OUT or not port_is_free(bus, host):
                continue
            _HANDED_OUT.add(bus)
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port found on {host} after {attempts} attempts")


def require_binary(name: str) -> str:
    """Absolute path of ``name`` on PATH, or a RuntimeError saying how to get it."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(
            f"`{name}` not found on PATH, and the integration tests need it: {_INSTALL_HINT}."
        )
    return path


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, or a note saying why there are none."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"<{path} is empty>"


def wait_until(
    predicate: Callable[[], bool], timeout: float, *, interval: float = POLL_INTERVAL
) -> bool:
    """Poll ``predicate`` every ``interval`` seconds until it holds (True) or time is up."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: ask the kernel directly
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = status.rpartition(")")[2].split()[:1]
    return state not in (["Z"], ["X"])


def terminate(procs: Sequence[subprocess.Popen[bytes]], grace: float = STOP_GRACE) -> None:
    """SIGTERM every process, wait up to ``grace`` seconds, SIGKILL the survivors, reap all."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)


def redis_command(port: int, *args: str, host: str = HOST, timeout: float = 1.0) -> str:
    """Send one command over a raw socket; return a simple, integer or bulk reply as text.

    Enough RESP for readiness probes without redis-py. Raises ``OSError`` when the server
    cannot be reached and ``RuntimeError`` on an error reply.
    """
    payload = b"*%d\r\n" % len(args)
    for arg in args:
        raw = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(raw), raw)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(payload)
        buf = b""
        while b"\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed before a reply")
            buf += chunk
        header, _, rest = buf.partition(b"\r\n")
        kind, value = header[:1], header[1:].decode()
        if kind in {b"+", b":"}:
            return value
        if kind == b"-":
            raise RuntimeError(f"redis error reply: {value}")
        if kind != b"$":
            raise RuntimeError(f"unexpected reply {header!r}")
        size = int(value)
        if size < 0:
            return ""
        while len(rest) < size + 2:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed in the middle of a reply")
            rest += chunk
        return rest[:size].decode(errors="replace")


def parse_info(text: str) -> dict[str, str]:
    """``INFO`` / ``CLUSTER INFO`` text as a dict."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            fields[key] = value.strip()
    return fields


# --------------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------------


class RedisServer(_Server):
    """One ``redis-server`` without persistence on a free loopback port, in a fresh temp dir."""

    def __init__(
        self,
        *,
        extra_args: Sequence[str] = (),
        cluster_bus: bool = False,
        start_timeout: float = START_TIMEOUT,
        stop_grace: float = STOP_GRACE,
    ) -> None:
        self.extra_args = list(extra_args)
        self.cluster_bus = cluster_bus
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._binary = ""

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("redis-server was never started")
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        if self.dir is None:
            raise RuntimeError("redis-server was never started")
        return self.dir / "redis.log"

    def start(self) -> Self:
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Spawn the process without waiting; ``wait_ready`` completes the start.

        Split in two so a cluster can launch all its nodes before waiting for any.
        """
        if self.proc is not None:
            raise RuntimeError("redis-server already started")
        self._binary = require_binary("redis-server")
        self.dir = Path(tempfile.mkdtemp(prefix="floodwall-redis-"))
        _register(self)
        self._spawn()

    def _spawn(self) -> None:
        self.port = free_port(cluster_bus=self.cluster_bus)
        cmd = [
            self._binary,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--port", str(self.port),
            "--bind", HOST,
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
            )

    def _answers(self) -> bool:
        """PING answered, by our own process rather than whoever else may hold the port."""
        try:
            if redis_command(self.port, "PING", timeout=0.5) != "PONG":
                return False
            info = parse_info(redis_command(self.port, "INFO", "server", timeout=0.5))
        except (OSError, RuntimeError):
            return False
        return info.get("process_id") == str(self.pid)

    def wait_ready(self) -> None:
        """Wait until the server answers; relaunch on a new port if its port was taken."""
        for attempt in range(1, START_ATTEMPTS + 1):
            proc = self.proc
            assert proc is not None, "launch() first"

            def up_or_dead(proc: subprocess.Popen[bytes] = proc) -> bool:
                return proc.poll() is not None or self._answers()

            wait_until(up_or_dead, self.start_timeout)
            if proc.poll() is None and self._answers():
                return
            tail = log_tail(self.log_path)
            if (
                proc.poll() is not None
                and _ADDRESS_IN_USE.search(tail)
                and attempt < START_ATTEMPTS
            ):
                self._spawn()
                continue
            if proc.poll() is None:
                state = f"did not answer PING within {self.start_timeout:g}s"
            else:
                state = f"exited with code {proc.returncode}"
            self.stop()
            raise ServerStartError(f"redis-server on {HOST}:{self.port} {state}. Log tail:\n{tail}")

    def stop(self) -> None:
        """Stop by pid (SIGTERM, SIGKILL after the grace period); remove the temp dir."""
        if self.proc is not None:
            terminate([self.proc], self.stop_grace)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        _unregister(self)


class RedisCluster(_Server):
    """A Redis Cluster of ``masters`` nodes, no replicas, created with ``redis-cli --cluster``."""

    def __init__(
        self,
        masters: int = 3,
        *,
        start_timeout: float = START_TIMEOUT,
        stop_grace: float = STOP_GRACE,
    ) -> None:
        self.masters = masters
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.nodes: list[RedisServer] = []

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, port) for port in self.ports]

    @property
    def url(self) -> str:
        return f"redis+cluster://{HOST}:{self.ports[0]}"

    def start(self) -> Self:
        if self.nodes:
            raise RuntimeError("cluster already started")
        cli = require_binary("redis-cli")
        require_binary("redis-server")
        _register(self)
        try:
            self.nodes = [
                RedisServer(
                    extra_args=_CLUSTER_NODE_ARGS,
                    cluster_bus=True,
                    start_timeout=self.start_timeout,
                    stop_grace=self.stop_grace,
                )
                for _ in range(self.masters)
            ]
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                node.wait_ready()
            self._create(cli)
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, cli: str) -> None:
        cmd = [
            cli,
            "--cluster", "create",
            *(f"{host}:{port}" for host, port in self.startup_nodes),
            "--cluster-replicas", "0",
            "--cluster-yes",
        ]  # fmt: skip
        try:
            result = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.start_timeout + 20,  # redis-cli itself sleeps 1 s per join poll
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ServerStartError(f"`{' '.join(cmd)}` timed out: {exc.output!r}") from exc
        if result.returncode != 0:
            raise ServerStartError(
                f"`{' '.join(cmd)}` failed with code {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}"
            )

    def _node_ok(self, port: int) -> bool:
        try:
            info = parse_info(redis_command(port, "CLUSTER", "INFO", timeout=0.5))
        except (OSError, RuntimeError):
            return False
        return (
            info.get("cluster_state") == "ok"
            and info.get("cluster_known_nodes") == str(self.masters)
            and info.get("cluster_slots_ok") == str(CLUSTER_SLOTS)
        )

    def _wait_ok(self) -> None:
        if wait_until(lambda: all(self._node_ok(port) for port in self.ports), self.start_timeout):
            return
        report = []
        for node in self.nodes:
            try:
                info = redis_command(node.port, "CLUSTER", "INFO", timeout=0.5)
            except (OSError, RuntimeError) as exc:
                info = repr(exc)
            report.append(f"--- node {node.port}:\n{info}\n{log_tail(node.log_path, 10)}")
        raise ServerStartError(
            f"Redis Cluster on ports {self.ports} not cluster_state:ok within "
            f"{self.start_timeout:g}s.\n" + "\n".join(report)
        )

    def stop(self) -> None:
        """Stop every node by pid (all at once, then reap) and remove their temp dirs."""
        terminate([node.proc for node in self.nodes if node.proc is not None], self.stop_grace)
        for node in self.nodes:
            node.stop()
        _unregister(self)


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------

_PG_BINARIES = ("initdb", "pg_ctl", "postgres")


def _version_key(bindir: Path) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in bindir.parent.name.split("."))
    except ValueError:
        return (-1,)


def find_postgres_bindir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres`` of one installation.

    PATH first (symlinks resolved, so ``/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin``
    works), then the highest version under ``/usr/lib/postgresql/*/bin`` (Debian's layout).
    """
    candidates: list[Path] = []
    for name in ("pg_ctl", "initdb", "postgres"):
        found = shutil.which(name)
        if found is not None:
            candidates += [Path(found).parent, Path(os.path.realpath(found)).parent]
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in _PG_BINARIES):
            return bindir
    missing = [name for name in _PG_BINARIES if shutil.which(name) is None]
    raise RuntimeError(
        f"PostgreSQL server binaries ({', '.join(missing or _PG_BINARIES)}) not found on PATH "
        f"nor in /usr/lib/postgresql/*/bin, and the integration tests need them: {_INSTALL_HINT}."
    )


def _unprivileged_account() -> pwd.struct_passwd | None:
    """The account to run PostgreSQL as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError(
        "running as root, and PostgreSQL refuses to; neither a `postgres` nor a `nobody` "
        "user exists to run it as"
    )


def _traversable(path: Path, account: pwd.struct_passwd) -> bool:
    """Roughly: can ``account`` reach ``path`` (x permission on it and every ancestor)?"""
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if directory.stat().st_uid == account.pw_uid:
            if not mode & stat.S_IXUSR:
                return False
        elif not mode & stat.S_IXOTH:
            return False
    return True


class PostgresServer(_Server):
    """A throwaway PostgreSQL cluster (initdb + pg_ctl) on a free loopback port.

    Durability is off (``--no-sync``, ``fsync=off`` ...), authentication is ``trust`` for the
    superuser ``floodwall``, and the database ``floodwall_test`` is created. As root the server
    runs as the ``postgres`` (else ``nobody``) system user, since PostgreSQL refuses root.
    :meth:`shutdown` and :meth:`restart` stop it and start it again on the same port and data
    dir; :meth:`stop` ends it for good.
    """

    def __init__(
        self, *, start_timeout: float = START_TIMEOUT, stop_grace: float = STOP_GRACE
    ) -> None:
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.port = 0
        self.base: Path | None = None
        self.bindir: Path | None = None
        self.account: pwd.struct_passwd | None = None
        self._env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}

    @property
    def dsn(self) -> str:
        return f"postgresql://{PG_USER}@{HOST}:{self.port}/{PG_DATABASE}"

    @property
    def data_dir(self) -> Path:
        if self.base is None:
            raise RuntimeError("PostgreSQL was never started")
        return self.base / "data"

    @property
    def log_path(self) -> Path:
        """The server's own log (pg_ctl -l)."""
        return self.data_dir.parent / "postgres.log"

    @property
    def tool_log_path(self) -> Path:
        """Output of initdb and pg_ctl."""
        return self.data_dir.parent / "tools.log"

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid``, if the server is (or was) running."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            return int(first)
        except (OSError, ValueError, RuntimeError):
            return None

    def _make_base(self) -> Path:
        parent: str | None = None
        if self.account is not None and not _traversable(Path(tempfile.gettempdir()), self.account):
            parent = "/tmp"  # world-traversable, whatever TMPDIR says
        base = Path(tempfile.mkdtemp(prefix="floodwall-pg-", dir=parent))
        if self.account is not None:
            os.chown(base, self.account.pw_uid, self.account.pw_gid)
        return base

    def _run(self, *args: str, timeout: float) -> int:
        """Run a PostgreSQL tool from the bindir, as the unprivileged account when root."""
        assert self.bindir is not None
        account = self.account
        with self.tool_log_path.open("ab") as log:
            log.write(f"$ {' '.join(args)}\n".encode())
            log.flush()
            return subprocess.run(
                [str(self.bindir / args[0]), *args[1:]],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                env=self._env,
                timeout=timeout,
                check=False,
                user=None if account is None else account.pw_uid,
                group=None if account is None else account.pw_gid,
                extra_groups=None if account is None else [],
            ).returncode

    def _fail(self, what: str) -> ServerStartError:
        return ServerStartError(
            f"PostgreSQL {what} (bindir {self.bindir}, port {self.port}).\n"
            f"--- initdb/pg_ctl output:\n{log_tail(self.tool_log_path)}\n"
            f"--- server log:\n{log_tail(self.log_path)}"
        )

    def start(self) -> Self:
        if self.base is not None:
            raise RuntimeError("PostgreSQL already started")
        self.bindir = find_postgres_bindir()
        self.account = _unprivileged_account()
        self.base = self._make_base()
        _register(self)
        try:
            self._initdb()
            self._pg_ctl_start()
            self._create_database()
        except BaseException:
            self.stop()
            raise
        return self

    def _initdb(self) -> None:
        code = self._run(
            "initdb",
            "-D", str(self.data_dir),
            "-A", "trust",
            "-U", PG_USER,
            "--no-sync",
            "-E", "UTF8",
            "--no-locale",
            timeout=60 + self.start_timeout,
        )  # fmt: skip
        if code != 0:
            raise self._fail(f"initdb failed with code {code}")

    def _pg_ctl_start(self) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = free_port()
            code = self._pg_ctl_start_once()
            if code == 0:
                return
            port_taken = _ADDRESS_IN_USE.search(log_tail(self.log_path, 10))
            if not (port_taken and attempt < START_ATTEMPTS):
                raise self._fail(f"pg_ctl start failed with code {code}")
            self._kill_postmaster(self.postmaster_pid())

    def _pg_ctl_start_once(self) -> int:
        """``pg_ctl start -w`` on ``self.port``: returns once the server accepts connections."""
        options = (
            f"-p {self.port} -k {self.data_dir} -c listen_addresses={HOST} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        try:
            return self._run(
                "pg_ctl",
                "-D", str(self.data_dir),
                "-o", options,
                "-l", str(self.log_path),
                "-w",
                "-t", str(max(1, round(self.start_timeout))),
                "start",
                timeout=self.start_timeout + 5,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise self._fail(f"pg_ctl start did not return within {exc.timeout:g}s") from exc

    def _create_database(self) -> None:
        import psycopg

        with psycopg.connect(
            host=HOST,
            port=self.port,
            user=PG_USER,
            dbname="postgres",
            autocommit=True,
            connect_timeout=round(self.start_timeout),
        ) as conn:
            conn.execute("CREATE DATABASE " + PG_DATABASE)

    def _kill_postmaster(self, pid: int | None) -> None:
        """SIGKILL the postmaster (its children exit on their own when it dies) and wait."""
        if pid is None or not pid_alive(pid):
            return
        with contextlib.suppress(OSError):
            if b"postgres" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return  # stale pid file, pid reused by something else
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), self.stop_grace)

    def _pg_ctl_stop(self, mode: str) -> None:
        """``pg_ctl stop -m mode``; SIGKILL the postmaster if that fails. Keeps the data dir."""
        pid = self.postmaster_pid() if self.base is not None else None
        if pid is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self._run(
                "pg_ctl",
                "-D", str(self.data_dir),
                "stop",
                "-m", mode,
                "-w",
                "-t", str(max(1, round(self.stop_grace))),
                timeout=self.stop_grace + 5,
            )  # fmt: skip
        self._kill_postmaster(pid)

    def shutdown(self) -> None:
        """Stop the server (``pg_ctl stop -m fast``: clients are disconnected, open transactions
        rolled back, a checkpoint written) but keep its data dir and port for :meth:`restart`."""
        if self.base is None:
            raise RuntimeError("PostgreSQL was never started")
        self._pg_ctl_stop("fast")

    def restart(self) -> None:
        """Start the server again after :meth:`shutdown`, on the same port and data dir; return
        once it accepts connections. A port taken meanwhile is an error (clients hold the DSN)."""
        if self.base is None:
            raise RuntimeError("PostgreSQL was never started")
        code = self._pg_ctl_start_once()
        if code != 0:
            raise self._fail(f"pg_ctl start (restart on the same port) failed with code {code}")

    def stop(self) -> None:
        """``pg_ctl stop -m immediate``; SIGKILL the postmaster if that fails; remove the dir."""
        self._pg_ctl_stop("immediate")
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
        _unregister(self)


FAULT_OPEN = 0.25
"""Seconds a fault test's store breaker stays open: short, to keep outages short."""


def store_breaker(name: str) -> CircuitBreaker:
    """A store guard's breaker for fault tests: opens on 3 store errors, open
    :data:`FAULT_OPEN` seconds at a time (no growth), so probe counts are easy to bound."""
    return CircuitBreaker(
        name,
        failure_rate=None,
        error_count=3,
        minimum_calls=3,
        open_duration=FAULT_OPEN,
        record=StoreUnavailableError,
    )


class RestartableRedis:
    """A redis-server that can be stopped and started again on the same port (fault tests:
    "stop Redis mid-load, start it again, and see the callers recover by themselves")."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="floodwall-redis-restartable-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def _answers(self) -> bool:
        try:
            return redis_command(self.port, "PING", timeout=0.2) == "PONG"
        except (OSError, RuntimeError):
            return False

    def start(self) -> None:
        cmd = [require_binary("redis-server"), "--port", str(self.port), "--bind", HOST]
        cmd += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        with (self.dir / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        if not wait_until(self._answers, 10):
            raise RuntimeError(f"redis-server did not come up on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            terminate([self.proc])
            self.proc = None

    def remove(self) -> None:
        """Stop it and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RestartablePostgres:
    """A PostgreSQL that can be stopped and started again on the same port and data dir, so its
    records survive (fault tests: "stop PostgreSQL mid-load, start it again, and see the callers
    recover by themselves"). Shaped like :class:`RestartableRedis`."""

    def __init__(self) -> None:
        self.server = PostgresServer()

    @property
    def dsn(self) -> str:
        return self.server.dsn

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> None:
        """The first start creates the cluster (:meth:`PostgresServer.start`); later ones restart
        it on the same port."""
        if self.server.base is None:
            self.server.start()
        else:
            self.server.restart()

    def stop(self) -> None:
        """``pg_ctl stop -m fast``, keeping the data."""
        self.server.shutdown()

    def remove(self) -> None:
        """Stop it and delete its directory."""
        self.server.stop()
