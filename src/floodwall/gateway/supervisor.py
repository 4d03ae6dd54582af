"""Running the gateway: workers, the admin listener, signals, config shared through Redis.

``workers: 1`` (the default) runs one :class:`~floodwall.gateway.app.Gateway` in this process.
``workers: N`` starts N worker processes that each bind the listen port with
``SO_REUSEPORT`` (the kernel spreads new connections over them) and each serve a control API
on a Unix socket in a private directory; the supervisor keeps the admin listener, merges the
workers' figures, fans operator changes and reloads out to all of them, and restarts a worker
that dies. Workers exit by themselves when the supervisor is gone.

Signals: ``SIGTERM``/``SIGINT`` stop gracefully (stop accepting, finish what is in flight for
``proxy.shutdown_timeout`` seconds, close); ``SIGHUP`` reloads the file.

**Handover**: a reload that changes ``listen`` or ``workers`` starts a new generation of
workers (in this process for one, else worker processes) on the new address with the new
document, and only once every one of them answers does the old generation stop accepting and
drain (its requests in flight finish, for up to ``proxy.shutdown_timeout``). The supervisor
owns the listening sockets (``SO_REUSEPORT``, one per worker, handed to the workers when they
start): on an unchanged address the new generation takes over the same sockets, so a connection
waiting in a socket's accept queue when the old generation stops is answered by the new one
(closing a listening socket would reset every connection in its queue); a new address gets new
sockets, and the old ones close once the old generation is gone. No connection is refused
during the change. The new generation's breakers, local rate limits and figures start afresh
(as after a restart); keep-alive connections of the old one close after their next answer,
or once idle for a second.

**Several gateways** (processes or hosts) with ``sync: {store: NAME}`` share, through that
Redis store: their configuration (a reload on any admin API is published; every gateway applies
it, and a gateway that starts later takes the shared one) and operator overrides (breakers
forced, levels shed: each also kept as a key ``{sync.key}:override:...`` that expires with the
override's ``ttl`` on Redis's clock, so a gateway that starts later applies the ones still in
force, for the time they have left). Global rate limits (``scope: global``) share their counters
there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Final

from floodwall._core.errors import ConfigError
from floodwall.config.loader import loads
from floodwall.config.registry import Registry
from floodwall.gateway._control import LocalWorker, RemoteWorker, control_app
from floodwall.gateway._server import listen_socket
from floodwall.gateway.admin import Admin, admin_token
from floodwall.gateway.app import RESTART_KEYS, Gateway
from floodwall.gateway.config import GatewayDocument, load_gateway, parse_gateway_text
from floodwall.gateway.dashboard import merge_status
from floodwall.gateway.metrics import merge

__all__ = ["Supervisor", "run", "worker_main"]

log = logging.getLogger("floodwall.gateway")

WORKER_START_TIMEOUT = 30.0
GC_THRESHOLD = 20_000
"""Allocations between two young-generation collections (CPython's default: 700)."""
RESTART_DELAY = 1.0
HANDOVER_OVERLAP = 0.5
"""Seconds both generations accept after a handover, for clients still switching address."""


class Supervisor:
    """The gateway as a whole (see [Gateway][guide-gateway]); the admin API's :class:`Control`."""

    def __init__(
        self,
        document: GatewayDocument,
        text: str,
        source: str,
        *,
        workers: int | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.document = document
        self.text = text
        self.source = source
        self.workers = workers or document.workers
        self._cli_workers = workers
        """``--workers``: when given, it stays whatever a reloaded file says."""
        self.environ = dict(os.environ if environ is None else environ)
        self.handles: list[LocalWorker | RemoteWorker] = []
        self.admin: Admin | None = None
        self.port = 0
        self.gateway: Gateway | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._rundir: Path | None = None
        self._gendir: Path | None = None
        """The current generation's directory: its config.json and control sockets."""
        self._generation = 0
        self._retiring: set[asyncio.Task[None]] = set()
        self._listeners: list[socket.socket] = []
        """The listening sockets of :attr:`_address`: worker ``i`` of ``n`` serves
        ``_listeners[i::n]``; they outlive the generations that serve them."""
        self._address: tuple[str, int] | None = None
        self._overrides: dict[tuple[str, str], tuple[str, str, float | None, str]] = {}
        """Operator overrides in force, by kind and target: action, target, until (loop time;
        ``None``: until ended) and reason, for workers that start later."""
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._lock = asyncio.Lock()
        self._origin = uuid.uuid4().hex
        self._local = loads(text, source)
        """The file's own document: its ``listen``, ``workers``, ``admin`` and ``event_loop``
        belong to this instance and are kept when a shared configuration is applied."""

    # -- starting ------------------------------------------------------------------------------

    async def start(self) -> None:
        doc = self.document
        token = admin_token(doc.admin.token_env, self.environ) if doc.admin is not None else None
        if doc.sync is not None:
            await self._adopt_shared()
            doc = self.document
        await self._start_generation(doc, self.workers)
        if doc.sync is not None:
            await self._replay_overrides()
        if doc.admin is not None and token is not None:
            self.admin = Admin(self, token, interval=doc.admin.dashboard_interval)
            await self.admin.start(*doc.admin.listen)
            log.info("admin listening on %s:%d", doc.admin.listen[0], self.admin.port)
        if doc.sync is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._follow()))

    async def _start_generation(self, doc: GatewayDocument, workers: int, version: int = 1) -> None:
        """Serve ``doc`` with ``workers`` workers (in this process for one) on its ``listen``;
        return once all of them answer. Sets :attr:`handles`, :attr:`port` and
        :attr:`workers`; the caller retires what served before."""
        self._generation += 1
        self._listeners = self._sockets_for(doc.listen, workers)
        self._address = doc.listen
        self.port = self._listeners[0].getsockname()[1]
        if workers == 1:
            gateway = Gateway(doc, text=self.text, source=self.source)
            gateway.version = version
            await gateway.start([sock.dup() for sock in self._listeners])
            self.gateway, self._procs = gateway, []
            self.handles = [LocalWorker(gateway)]
            self.workers = 1
            return
        if self._rundir is None:
            self._rundir = Path(tempfile.mkdtemp(prefix="floodwall-gateway-"))
        gendir = self._rundir / f"gen-{self._generation}"
        gendir.mkdir()
        self.gateway, self._gendir, self.workers = None, gendir, workers
        self._write_config(version)
        self.handles = [RemoteWorker(str(gendir / f"worker-{i}.sock"), i) for i in range(workers)]
        self._procs = [self._spawn(i) for i in range(workers)]
        await asyncio.gather(*(self._wait_ready(i) for i in range(workers)))
        if not any(t.get_name() == "floodwall-watch" for t in self._tasks):
            watch = asyncio.get_running_loop().create_task(self._watch(), name="floodwall-watch")
            self._tasks.append(watch)

    def _sockets_for(self, listen: tuple[str, int], count: int) -> list[socket.socket]:
        """At least ``count`` listening sockets on ``listen``: the running ones when the
        address is unchanged (a handover keeps them, and so the connections in their queues),
        and new ones bound beside them up to ``count``."""
        host, port = listen
        socks = list(self._listeners) if listen == self._address else []
        try:
            while len(socks) < count:
                bound = socks[0].getsockname()[1] if socks else port
                socks.append(listen_socket(host, bound, reuse_port=True))
        except BaseException:
            self._close_sockets(socks)
            raise
        return socks

    def _close_sockets(self, socks: list[socket.socket]) -> None:
        """Close those of ``socks`` the running generation does not listen on."""
        for sock in socks:
            if sock not in self._listeners:
                sock.close()

    def _renew_sockets(self, index: int) -> None:
        """Worker ``index`` died: its sockets close (connections still in their queues are
        reset, as they would be anyway) and new ones take their place, so that new
        connections go to the live workers while it restarts."""
        host, _ = self._address or self.document.listen
        for position in range(index, len(self._listeners), self.workers):
            old = self._listeners[position]
            self._listeners[position] = listen_socket(host, self.port, reuse_port=True)
            old.close()

    def _write_config(self, version: int = 1) -> None:
        if self._gendir is None:
            return
        (self._gendir / "config.json").write_text(
            json.dumps({"text": self.text, "source": self.source, "version": version}),
            encoding="utf-8",
        )

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        assert self._gendir is not None
        fds = [sock.fileno() for sock in self._listeners[index :: self.workers]]
        command = [
            sys.executable,
            "-m",
            "floodwall.gateway",
            "--worker",
            str(index),
            "--rundir",
            str(self._gendir),
            "--fds",
            ",".join(map(str, fds)),
        ]
        return subprocess.Popen(  # noqa: S603 - our own interpreter
            command, env=self.environ, pass_fds=fds
        )

    async def _handover(self, document: GatewayDocument, text: str, source: str) -> dict[str, Any]:
        """Serve ``document`` by a new generation (``listen`` or ``workers`` changed), then
        retire the old one: it stops accepting and drains (see the module)."""
        names = ("gateway", "_procs", "handles", "_listeners", "_address", "document", "text")
        saved = {name: getattr(self, name) for name in (*names, "source", "workers", "port")}
        saved["_gendir"] = self._gendir
        old_doc = self.document
        version = (await self.handles[0].status())["version"] + 1
        self.text, self.document = text, document
        if not source.startswith("<admin") and not source.startswith("redis:"):
            self.source = source
        try:
            await self._start_generation(document, self._target_workers(document), version)
        except BaseException:
            new_gateway = self.gateway if self.gateway is not saved["gateway"] else None
            new_sockets = self._listeners
            new_procs = self._procs if self._procs is not saved["_procs"] else []
            new_handles = self.handles if self.handles is not saved["handles"] else []
            for name, value in saved.items():
                setattr(self, name, value)
            await self._retire(new_gateway, new_procs, new_handles, new_sockets)
            raise
        await self._reapply_overrides(self.handles)
        old_gateway, old_procs = saved["gateway"], saved["_procs"]
        old_handles, old_sockets = saved["handles"], saved["_listeners"]
        retiring = asyncio.get_running_loop().create_task(
            self._retire(old_gateway, old_procs, old_handles, old_sockets, HANDOVER_OVERLAP)
        )
        self._retiring.add(retiring)
        retiring.add_done_callback(self._retiring.discard)
        log.info(
            "handover: %d worker(s) on %s:%d took over (version %d)",
            self.workers,
            document.listen[0],
            self.port,
            version,
        )
        restart = [
            k for k in ("admin", "event_loop") if getattr(document, k) != getattr(old_doc, k)
        ]
        return {
            "applied": True,
            "version": version,
            "restart_required": restart,
            "handover": {"listen": f"{document.listen[0]}:{self.port}", "workers": self.workers},
        }

    async def _retire(
        self,
        gateway: Gateway | None,
        procs: list[subprocess.Popen[bytes]],
        handles: list[LocalWorker | RemoteWorker],
        sockets: list[socket.socket] | None = None,
        after: float = 0.0,
    ) -> None:
        """Stop a generation gracefully (``after`` seconds from now): it stops accepting and
        finishes what is in flight. Those of its listening ``sockets`` the running generation
        does not use close first (here; the generation closes its own copies as it stops), so
        that new connections are refused at once rather than queued on a socket nobody will
        accept from."""
        if after > 0:
            await asyncio.sleep(after)
        if sockets:
            self._close_sockets(sockets)
        if gateway is not None:
            await gateway.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        grace = self.document.proxy.shutdown_timeout + 5.0
        for proc in procs:
            try:
                await asyncio.to_thread(proc.wait, grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait, 5.0)
        for handle in handles:
            if isinstance(handle, RemoteWorker):
                await handle.close()

    def _kept(
        self, document: GatewayDocument, text: str, source: str
    ) -> tuple[GatewayDocument, str]:
        """``document`` with the running ``listen`` and ``workers`` where its text does not
        name them: a document that leaves them out keeps the gateway where it is (a handover
        happens only for an address or a count the document asks for)."""
        raw = loads(text, source)
        missing = [key for key in ("listen", "workers") if key not in raw]
        if not missing:
            return document, text
        host, port = self.document.listen
        running = {
            "listen": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
            "workers": self.document.workers,
        }
        raw.update({key: running[key] for key in missing})
        text = json.dumps(raw)
        return parse_gateway_text(text, source), text

    def _target_workers(self, document: GatewayDocument) -> int:
        return self._cli_workers or document.workers

    async def _wait_ready(self, index: int) -> None:
        handle = self.handles[index]
        loop = asyncio.get_running_loop()
        until = loop.time() + WORKER_START_TIMEOUT
        while True:
            proc = self._procs[index]
            if proc.poll() is not None:
                raise RuntimeError(f"gateway worker {index} exited with {proc.returncode} at start")
            with contextlib.suppress(OSError, Exception):
                await handle.status()
                return
            if loop.time() > until:
                raise RuntimeError(f"gateway worker {index} not ready in {WORKER_START_TIMEOUT}s")
            await asyncio.sleep(0.05)

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(0.5)
            procs = self._procs
            for index, proc in enumerate(procs):
                if proc.poll() is not None and not self._stopping and self._procs is procs:
                    log.warning(
                        "gateway worker %d exited (%s); restarting it", index, proc.returncode
                    )
                    await asyncio.sleep(RESTART_DELAY)
                    if self._procs is not procs:  # a handover retired that generation
                        break
                    self._renew_sockets(index)
                    procs[index] = self._spawn(index)
                    with contextlib.suppress(RuntimeError):
                        await self._wait_ready(index)
                        await self._reapply_overrides([self.handles[index]])

    # -- the Control interface ----------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        """The workers' status merged; a worker that does not answer (dead, restarting,
        frozen: within the control timeout) is listed in ``workers_down`` with the reason,
        and the figures are those of the workers that answered."""
        handles, procs = list(self.handles), list(self._procs)
        answers = await asyncio.gather(*(h.status() for h in handles), return_exceptions=True)
        statuses = [a for a in answers if isinstance(a, dict)]
        merged = merge_status(statuses) if statuses else {"routes": {}, "upstreams": {}}
        merged["workers"] = len(handles)
        merged["workers_up"] = len(statuses)
        merged["workers_down"] = [
            {
                "worker": i,
                "pid": procs[i].pid if i < len(procs) else None,
                "reason": _down_reason(a),
            }
            for i, a in enumerate(answers)
            if isinstance(a, BaseException)
        ]
        return merged

    async def metrics(self) -> str:
        """The workers' metrics, each sample labelled with its worker, and
        ``floodwall_gateway_worker_up{worker}`` (0 for a worker that did not answer)."""
        handles = list(self.handles)
        answers = await asyncio.gather(*(h.metrics() for h in handles), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, ImportError):
                raise answer
        texts = {i: a for i, a in enumerate(answers) if isinstance(a, str)}
        up = "".join(
            f'floodwall_gateway_worker_up{{worker="{i}"}} {int(i in texts)}\n'
            for i in range(len(handles))
        )
        worker_up = (
            "# HELP floodwall_gateway_worker_up Whether the worker answered this scrape.\n"
            f"# TYPE floodwall_gateway_worker_up gauge\n{up}"
        )
        if len(handles) == 1 and texts:
            return texts[0]
        return merge(list(texts.values()), workers=list(texts)) + worker_up

    async def reload(
        self, text: str | None, source: str, *, publish: bool = True
    ) -> dict[str, Any]:
        """Apply ``text`` (or re-read the file when ``None``) on every worker; all or nothing
        as far as validation goes: an invalid document reaches none of them."""
        async with self._lock:
            if text is None:
                if self.source.startswith("<") or not Path(self.source).exists():  # noqa: ASYNC240
                    raise ConfigError("no body given and the gateway was not started from a file")
                document, text = load_gateway(self.source)
                source = self.source
            else:
                document = parse_gateway_text(text, source or "<admin>")
            document, text = self._kept(document, text, source)
            try:
                Registry(document, metrics=False)
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from None
            if document.listen != self.document.listen or (
                self._target_workers(document) != self.workers
            ):
                return await self._handover(document, text, source)
            handles, procs = list(self.handles), list(self._procs)
            answers = await asyncio.gather(
                *(h.reload(text, source) for h in handles), return_exceptions=True
            )
            for answer in answers:
                if isinstance(answer, ConfigError):
                    raise answer
            results = [a for a in answers if isinstance(a, dict)]
            stuck = [i for i, a in enumerate(answers) if isinstance(a, BaseException)]
            if stuck and (not results or not procs):  # (no worker left to restart it from)
                raise answers[stuck[0]]  # type: ignore[misc]
            self.document, self.text = document, text
            if not source.startswith("<admin") and not source.startswith("redis:"):
                self.source = source
            self._write_config(results[0].get("version", 1))
            for index in stuck:  # restarted (see _watch) on the configuration just written
                log.warning(
                    "gateway worker %d did not apply the reload (%s); restarting it",
                    index,
                    _down_reason(answers[index]),  # type: ignore[arg-type]
                )
                with contextlib.suppress(ProcessLookupError):
                    procs[index].kill()
            if publish and self.document.sync is not None:
                await self._publish({"type": "config", "text": text, "source": source})
            return {**results[0], "workers": len(answers), "restarted": stuck}

    async def override(
        self, action: str, target: str, ttl: float | None, reason: str, *, publish: bool = True
    ) -> None:
        """Apply an operator override on every worker, and keep it for the workers that start
        while it is in force (a restarted worker, a handover's new generation). A worker that
        does not answer in time is restarted, and gets it then."""
        handles, procs = list(self.handles), list(self._procs)
        answers = await asyncio.gather(
            *(h.override(action, target, ttl, reason) for h in handles), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, (ConfigError, KeyError)):
                raise answer
        if all(isinstance(a, BaseException) for a in answers) or not procs:
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
        now = asyncio.get_running_loop().time()
        kind = _override_kind(action)
        if action in ENDING_OVERRIDES:
            self._overrides.pop((kind, target), None)
        else:
            until = now + ttl if ttl else None
            self._overrides[(kind, target)] = (action, target, until, reason)
        for index, answer in enumerate(answers):
            if isinstance(answer, BaseException):
                log.warning(
                    "gateway worker %d did not apply the override (%s); restarting it",
                    index,
                    _down_reason(answer),
                )
                with contextlib.suppress(ProcessLookupError):
                    procs[index].kill()
        if publish and self.document.sync is not None:
            await self._keep_override(action, target, ttl, reason)
            await self._publish(
                {
                    "type": "override",
                    "action": action,
                    "target": target,
                    "ttl": ttl,
                    "reason": reason,
                }
            )

    # -- sharing through Redis -----------------------------------------------------------------

    def _redis_client(self) -> Any:
        sync = self.document.sync
        assert sync is not None
        url = self.document.stores[sync.store]
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"sync.store: sharing needs a redis:// store, got {url!r}")
        import redis.asyncio

        return redis.asyncio.Redis.from_url(url)

    async def _adopt_shared(self) -> None:
        sync = self.document.sync
        assert sync is not None
        client = self._redis_client()
        try:
            raw = await client.get(f"{sync.key}:config")
        finally:
            await client.aclose()
        if raw is None:
            return
        shared = json.loads(raw)
        try:
            text = self._localised(shared["text"], shared["source"])
            self.document = parse_gateway_text(text, f"redis:{sync.key}.json")
        except ConfigError as exc:
            log.warning("the shared configuration is invalid, keeping the file's: %s", exc)
            return
        self.text, self.source = text, f"redis:{sync.key}.json"
        log.info("using the shared configuration from %s (not the file's)", sync.key)

    def _override_key(self, action: str, target: str) -> str:
        sync = self.document.sync
        assert sync is not None
        return f"{sync.key}:override:{_override_kind(action)}:{target}"

    async def _reapply_overrides(self, handles: list[LocalWorker | RemoteWorker]) -> None:
        """Give workers that just started the overrides still in force, each for the time it
        has left (a worker that refuses one, e.g. a breaker the new document no longer has,
        logs why)."""
        now = asyncio.get_running_loop().time()
        silent: set[int] = set()  # (a worker that timed out gets no more: one wait per worker)
        for key, (action, target, until, reason) in list(self._overrides.items()):
            if until is not None and until <= now:
                del self._overrides[key]
                continue
            ttl = None if until is None else until - now
            asking = [h for h in handles if id(h) not in silent]
            answers = await asyncio.gather(
                *(h.override(action, target, ttl, reason) for h in asking), return_exceptions=True
            )
            for handle, answer in zip(asking, answers, strict=True):
                if isinstance(answer, TimeoutError):
                    silent.add(id(handle))
                if isinstance(answer, Exception):
                    log.warning("the override %s %s was not kept: %r", action, target, answer)

    async def _keep_override(
        self, action: str, target: str, ttl: float | None, reason: str
    ) -> None:
        """Record an override for gateways that start later (an ending one is deleted)."""
        key = self._override_key(action, target)
        client = self._redis_client()
        try:
            if action in ENDING_OVERRIDES:
                await client.delete(key)
            else:
                value = json.dumps({"action": action, "target": target, "reason": reason})
                await client.set(key, value, px=max(1, round(ttl * 1000)) if ttl else None)
        finally:
            await client.aclose()

    async def _replay_overrides(self) -> None:
        """Apply the shared overrides still in force, each for the time it has left."""
        sync = self.document.sync
        assert sync is not None
        client = self._redis_client()
        kept: list[tuple[dict[str, Any], int]] = []
        try:
            async for key in client.scan_iter(match=f"{sync.key}:override:*"):
                raw, left = await client.get(key), await client.pttl(key)
                if raw is not None and left != -2:  # -2: expired meanwhile
                    kept.append((json.loads(raw), left))
        finally:
            await client.aclose()
        for entry, left in kept:
            ttl = left / 1000 if left > 0 else None
            try:
                await self.override(
                    entry["action"], entry["target"], ttl, entry.get("reason", ""), publish=False
                )
            except ConfigError as exc:
                log.warning("a shared override was refused here: %s", exc)
            else:
                log.info("applied the shared override %s %s", entry["action"], entry["target"])

    def _localised(self, text: str, source: str) -> str:
        """A shared document with this instance's own ``listen``, ``workers``, ``admin`` and
        ``event_loop`` (JSON text)."""
        raw = loads(text, source)
        for key in RESTART_KEYS:
            if key in self._local:
                raw[key] = self._local[key]
            else:
                raw.pop(key, None)
        return json.dumps(raw)

    async def _publish(self, message: dict[str, Any]) -> None:
        sync = self.document.sync
        assert sync is not None
        payload = json.dumps({**message, "origin": self._origin})
        client = self._redis_client()
        try:
            if message["type"] == "config":
                await client.set(f"{sync.key}:config", json.dumps(message))
            await client.publish(f"{sync.key}:events", payload)
        finally:
            await client.aclose()

    async def _follow(self) -> None:
        """Apply what other gateways publish, until stopped (reconnecting after errors)."""
        import redis.exceptions

        while not self._stopping:
            sync = self.document.sync
            if sync is None:
                return
            client = self._redis_client()
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(f"{sync.key}:events")
                while not self._stopping:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        await self._apply_shared(json.loads(message["data"]))
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("config sharing: %s; retrying", exc)
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                    await client.aclose()

    async def _apply_shared(self, message: dict[str, Any]) -> None:
        if message.get("origin") == self._origin:
            return
        try:
            if message["type"] == "config":
                text = self._localised(message["text"], message["source"])
                await self.reload(text, f"redis:{message['source']}.json", publish=False)
            elif message["type"] == "override":
                await self.override(
                    message["action"],
                    message["target"],
                    message.get("ttl"),
                    message.get("reason", ""),
                    publish=False,
                )
        except ConfigError as exc:
            log.warning("a shared %s was refused here: %s", message.get("type"), exc)

    # -- stopping ------------------------------------------------------------------------------

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        if self.admin is not None:
            await self.admin.stop()
        sockets, self._listeners = self._listeners, []
        await self._retire(self.gateway, self._procs, self.handles, sockets)
        if self._rundir is not None:
            shutil.rmtree(self._rundir, ignore_errors=True)


ENDING_OVERRIDES: Final = frozenset({"clear", "restore", "chaos_off"})
"""Override actions that end an override (the state goes back to what the policies decide)."""


def _override_kind(action: str) -> str:
    """What an override acts on: overrides of one kind and target replace each other."""
    if action in ("shed", "restore"):
        return "level"
    if action in ("chaos_on", "chaos_off"):
        return "chaos"
    return "breaker"


def _down_reason(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "no answer within the control timeout (frozen or overloaded)"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


# -- entry points --------------------------------------------------------------------------------


def _tune_gc() -> None:
    """Keep the collector's pauses out of the tail latency: what was built at start-up (the
    configuration, the routes, the imported modules) is frozen out of every collection, and the
    youngest generation is collected less often (a proxy allocates many short-lived objects,
    almost all freed by reference counting long before a collection would look at them)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 100)


def _loop_factory(choice: str) -> Any:
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("event_loop: uvloop is not installed (pip install uvloop)") from None
        return None
    return uvloop.new_event_loop


async def _serve(supervisor: Supervisor, ready: asyncio.Event | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def hup() -> None:
        async def again() -> None:
            try:
                await supervisor.reload(None, supervisor.source)
            except ConfigError as exc:
                log.warning("SIGHUP reload refused: %s", exc)

        reloads.add(task := loop.create_task(again()))
        task.add_done_callback(reloads.discard)

    reloads: set[asyncio.Task[None]] = set()
    loop.add_signal_handler(signal.SIGHUP, hup)
    await supervisor.start()
    _tune_gc()
    log.info("gateway up: %d worker(s) on port %d", supervisor.workers, supervisor.port)
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("stopping: finishing requests in flight")
    await supervisor.stop()


def run(config: str, workers: int | None = None) -> None:
    """Run the gateway of file ``config`` until SIGTERM/SIGINT (the CLI's ``gateway``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    document, text = load_gateway(config)
    supervisor = Supervisor(document, text, config, workers=workers)
    factory = _loop_factory(document.event_loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve(supervisor))


async def _worker(index: int, rundir: Path, fds: list[int]) -> None:
    saved = json.loads((rundir / "config.json").read_text(encoding="utf-8"))
    document = parse_gateway_text(saved["text"], saved["source"])
    gateway = Gateway(document, text=saved["text"], source=saved["source"])
    gateway.version = saved.get("version", 1)
    await gateway.start([socket.socket(fileno=fd) for fd in fds])
    _tune_gc()
    from aiohttp import web

    runner = web.AppRunner(control_app(gateway), access_log=None, handle_signals=False)
    await runner.setup()
    path = str(rundir / f"worker-{index}.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    await web.UnixSite(runner, path).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        if os.getppid() != parent:  # the supervisor is gone: do not linger as an orphan
            break
    await gateway.stop()
    await runner.cleanup()


def worker_main(index: int, rundir: str, fds: str) -> None:
    """A worker process's main (``python -m floodwall.gateway --worker N ...``): it serves the
    listening sockets the supervisor handed it (``fds``: their descriptors, comma-separated)."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s worker-{index} %(name)s %(levelname)s %(message)s"
    )
    saved = json.loads((Path(rundir) / "config.json").read_text(encoding="utf-8"))
    choice = parse_gateway_text(saved["text"], saved["source"]).event_loop
    with asyncio.Runner(loop_factory=_loop_factory(choice)) as runner:
        runner.run(_worker(index, Path(rundir), [int(fd) for fd in fds.split(",")]))
