"""The registry: named resources built from one document, live.

``Registry(document)`` builds one :class:`Resource` per entry of ``resources``. A resource is a
policy (``call``/``call_async``/decorator) whose pipeline, built in the fixed order

    sampled_drop -> fallback -> cache -> circuit_breaker -> bulkhead -> rate_limit -> adaptive
    -> idempotency -> retry -> timeout -> call

can be swapped by :meth:`Registry.reload` while callers hold on to it: decorated functions and
stored handles follow reloads. A reload is all or nothing: the document is validated and built
aside (stores, then resources) before one swap; an invalid document raises
:class:`ConfigError`, emits a ``config_rejected`` event, logs a warning and leaves the running
configuration untouched, and so does an empty one or one that drops every resource (unless
``allow_empty=True``). A changed threshold reconfigures the existing breaker, so its state and
counts survive; a removed resource is drained (handles still work with its last pipeline, it is
just no longer listed or reachable by name). A store whose URL a reload changes or removes is
closed at the next reload, so drained handles have that long to finish.

Operator overrides (force a breaker open or closed, shed a dependency level) are explicit,
listed by :meth:`Registry.overrides`, and expire after their TTL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from pydantic import ValidationError

from floodwall._core import validate
from floodwall._core.admission import Gate
from floodwall._core.clock import SYSTEM_CLOCK, Clock
from floodwall._core.errors import ConfigError, DegradedError
from floodwall._core.events import Event, EventListener, Listeners
from floodwall._core.meter import DEGRADED as _DEGRADED
from floodwall._core.meter import CallObserver, Degradation, Meter, Metering
from floodwall._core.options import kwargs
from floodwall._core.policy import Policy
from floodwall._core.validate import PLAIN_INT
from floodwall.adaptive import (
    AdaptiveLimiter,
    AIMDLimit,
    Gradient2Limit,
    GradientLimit,
    Limit,
    VegasLimit,
)
from floodwall.adaptive.windowed import WindowedLimit
from floodwall.backoff import (
    Backoff,
)
from floodwall.breaker import CircuitBreaker
from floodwall.budget import RetryBudget
from floodwall.bulkhead import Bulkhead
from floodwall.chaos import ChaosPolicy
from floodwall.config.schema import (
    AdaptiveConfig,
    BackoffConfig,
    BulkheadConfig,
    Document,
    RateLimitConfig,
    ResourceConfig,
    RetryConfig,
)
from floodwall.degrade.sampled import SampledDrop
from floodwall.fallback import Fallback
from floodwall.pipeline import ANSWERING, Pipeline, _stages, chain
from floodwall.ratelimit import (
    GCRA,
    FixedWindow,
    LeakyBucket,
    RateLimiter,
    SlidingLog,
    SlidingWindowCounter,
    TokenBucket,
)
from floodwall.retry import Retry
from floodwall.shared.cache import Cache
from floodwall.shared.global_limit import GlobalLimiter
from floodwall.shared.host_bulkhead import HostBulkhead
from floodwall.shared.idempotency import Idempotency
from floodwall.stores import Store, connect
from floodwall.stores.base import redact
from floodwall.stores.host import HostStore
from floodwall.timeout import Timeout

__all__ = ["Built", "Override", "Registry", "Resource", "build", "build_backoff"]

P = ParamSpec("P")
R = TypeVar("R")

_log = logging.getLogger("floodwall.config")


def build_backoff(config: BackoffConfig) -> Backoff:
    """The backoff object a ``backoff:`` section describes (:meth:`BackoffConfig.backoff`)."""
    validate.instance("config", config, BackoffConfig, "a BackoffConfig")
    return config.backoff()


def _new_budget(
    name: str, config: RetryConfig, clock: Clock, budgets: dict[str, RetryBudget]
) -> RetryBudget | None:
    """The resource's retry budget: shared by name across resources, reused across reloads."""
    budget = config.budget
    if budget is None:
        return None
    key = budget.shared or f"resource:{name}"
    existing = budgets.get(key)
    wanted = (budget.ratio, budget.min_per_second, budget.window)
    if (
        existing is not None
        and (existing.ratio, existing.min_per_second, existing.window) == wanted
    ):
        return existing
    fresh = RetryBudget(
        budget.ratio,
        min_per_second=budget.min_per_second,
        window=budget.window,
        name=key,
        clock=clock,
    )
    budgets[key] = fresh
    return fresh


class FieldError(ConfigError):
    """A field of a section failed to build: ``FieldError(field, reason)``; :func:`build` puts
    the section's path before the field (``resources.orders.adaptive.options: …``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field


class StoreFieldError(FieldError):
    """The ``store`` field of a section names a store that cannot serve it (unknown, a URL
    that cannot be opened, the wrong kind)."""

    def __init__(self, reason: str) -> None:
        super().__init__("store", reason)


def _no_store(name: str) -> Store:
    raise StoreFieldError(f"no store named {name!r} (stores: are resolved by a Registry)")


def open_store(name: str, stores: Mapping[str, str]) -> Store:
    """Connect to the ``stores:`` entry ``name``; :class:`StoreFieldError` naming the entry,
    its URL and the reason when it is unknown or cannot be opened."""
    url = stores.get(name)
    if url is None:
        known = ", ".join(sorted(stores)) or "none"
        raise StoreFieldError(f"no store named {name!r} (stores: {known})")
    try:
        return connect(url)
    except Exception as exc:  # any failure to open it is the entry's, named with its URL
        plain = isinstance(exc, ConfigError | ValueError)
        why = str(exc) if plain else f"{type(exc).__name__}: {exc}"
        shown = redact(url)
        value = "" if shown in why else f" = {shown!r}"
        raise StoreFieldError(f"stores.{name}{value} cannot be opened: {why}") from exc


@contextlib.contextmanager
def _at(resource: str, section: str) -> Iterator[None]:
    """Turn any error raised while building ``section`` into a :class:`ConfigError` naming the
    path: ``resources.<resource>.<section>[.<field>]: <reason>`` (a build never half-fails)."""
    try:
        yield
    except FieldError as exc:
        raise ConfigError(f"resources.{resource}.{section}.{exc.field}: {exc}") from exc
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"resources.{resource}.{section}: {exc}") from exc
    except Exception as exc:  # a bug or an OS error while building: still a refusal
        raise ConfigError(f"resources.{resource}.{section}: {type(exc).__name__}: {exc}") from exc


def build_limiter(
    name: str,
    config: RateLimitConfig,
    clock: Clock,
    listeners: Listeners,
    store: Callable[[str], Store] = _no_store,
) -> RateLimiter[Any] | GlobalLimiter:
    """The limiter a ``rate_limit:`` section describes: in-process (``scope: local``) or
    shared by every process through a store (``scope: global``, or ``host`` on ``host://``)."""
    options = kwargs(config.options())
    common: dict[str, Any] = {"name": f"{name}.rate_limit", "clock": clock, "listeners": listeners}
    if config.scope != "local":  # the schema checked the algorithm has a shared form
        return GlobalLimiter(store=store(config.store), **options, **common)
    limiters: dict[str, Any] = {
        "token_bucket": TokenBucket,
        "gcra": GCRA,
        "leaky": LeakyBucket,
        "fixed": FixedWindow,
        "sliding_log": SlidingLog,
        "sliding": SlidingWindowCounter,
    }
    limiter: RateLimiter[Any] = limiters[config.algorithm](**options, **common)
    return limiter


def build_bulkhead(
    name: str,
    config: BulkheadConfig,
    clock: Clock,
    listeners: Listeners,
    store: Callable[[str], Store] = _no_store,
) -> Bulkhead | HostBulkhead:
    """The bulkhead a ``bulkhead:`` section describes: per process (``scope: local``) or one
    for the whole host (``scope: host``, its slots in a ``host://`` store)."""
    if config.scope == "host":
        held = store(config.store)
        if not isinstance(held, HostStore):
            raise StoreFieldError(f"scope: host needs a host:// store, got {held.url!r}")
        return HostBulkhead(
            name,
            store=held,
            max_concurrent=config.max_concurrent,
            max_queue=config.max_queue,
            max_wait=config.max_wait,
            on_store_error=config.on_store_error,
            expected_instances=config.expected_instances,
            clock=clock,
            listeners=listeners,
        )
    return Bulkhead(name, clock=clock, listeners=listeners, **kwargs(config.options()))


@dataclass(frozen=True)
class Built:
    """The policies one resource's config describes, in pipeline order."""

    policies: tuple[Policy, ...]
    fallback: Fallback[Any] | None
    breaker: CircuitBreaker | None
    retry: Retry | None
    timeout: Timeout | None
    bulkhead: Bulkhead | HostBulkhead | None = None
    limiter: RateLimiter[Any] | GlobalLimiter | None = None
    sampled: SampledDrop | None = None
    cache: Cache | None = None
    adaptive: AdaptiveLimiter | None = None
    chaos: ChaosPolicy | None = None

    def replace(self, old: Policy, new: Policy, field: str) -> Built:
        """The same policies with ``old`` swapped for the live ``new`` (kept across reloads)."""
        policies = tuple(new if p is old else p for p in self.policies)
        changes: dict[str, Any] = {"policies": policies, field: new}
        return dataclasses.replace(self, **changes)


_ALGORITHMS: dict[str, Callable[..., Limit]] = {
    "aimd": AIMDLimit,
    "vegas": VegasLimit,
    "gradient": GradientLimit,
    "gradient2": Gradient2Limit,
}


def build_adaptive(
    name: str, config: AdaptiveConfig, clock: Clock, listeners: Listeners
) -> AdaptiveLimiter:
    """The adaptive concurrency limiter an ``adaptive:`` section describes."""
    algorithm: Limit = _ALGORITHMS[config.algorithm](**kwargs(config.algorithm_options()))
    if config.windowed:
        algorithm = WindowedLimit(algorithm)
    return AdaptiveLimiter(
        algorithm,
        name=f"{name}.adaptive",
        clock=clock,
        listeners=listeners,
        **kwargs(config.limiter_options()),
    )


def build(
    name: str,
    config: ResourceConfig,
    *,
    clock: Clock,
    budget: Callable[[str, RetryConfig], RetryBudget | None],
    listeners: Listeners,
    store: Callable[[str], Store] = _no_store,
    allow_chaos: bool = False,
) -> Built:
    """Build the policies of one resource, in the order sampled_drop -> fallback -> cache ->
    circuit_breaker -> bulkhead -> rate_limit -> adaptive -> idempotency -> retry -> timeout.

    Any error is a :class:`ConfigError` naming the section's path, like a schema error
    (``resources.orders.rate_limit.store: stores.shared cannot be opened: …``)."""
    fallback = breaker = retry = timeout = bulkhead = limiter = sampled = cache = adaptive = None
    idempotency = chaos = None
    if config.sampled_drop is not None:
        with _at(name, "sampled_drop"):
            sampled = SampledDrop(
                **kwargs(config.sampled_drop.options()),
                name=f"{name}.sampled_drop",
                clock=clock,
                listeners=listeners,
            )
    if config.fallback is not None:
        with _at(name, "fallback"):
            fallback = Fallback(
                **kwargs(config.fallback.options()),
                name=f"{name}.fallback",
                clock=clock,
                listeners=listeners,
            )
    if config.cache is not None:
        cc = config.cache
        with _at(name, "cache"):
            cache = Cache(
                **kwargs(cc.options()),
                store=None if cc.store is None else store(cc.store),
                name=f"{name}.cache",
                clock=clock,
                listeners=listeners,
            )
    if config.circuit_breaker is not None:
        options = kwargs(config.circuit_breaker.options())
        with _at(name, "circuit_breaker"):
            breaker = CircuitBreaker(name, clock=clock, listeners=listeners, **options)
    if config.bulkhead is not None:
        with _at(name, "bulkhead"):
            bulkhead = build_bulkhead(name, config.bulkhead, clock, listeners, store)
    if config.rate_limit is not None:
        with _at(name, "rate_limit"):
            limiter = build_limiter(name, config.rate_limit, clock, listeners, store)
    if config.adaptive is not None:
        with _at(name, "adaptive"):
            adaptive = build_adaptive(name, config.adaptive, clock, listeners)
    if config.idempotency is not None:
        with _at(name, "idempotency"):
            ic = config.idempotency
            idempotency = Idempotency(
                store(ic.store),
                **kwargs(ic.options()),
                name=f"{name}.idempotency",
                clock=clock,
                listeners=listeners,
            )
    if config.retry is not None:
        with _at(name, "retry"):
            rc = config.retry
            retry = Retry(
                name,
                attempts=rc.attempts,
                backoff=build_backoff(rc.backoff),
                budget=budget(name, rc),
                deadline=rc.deadline,
                idempotent=rc.idempotent,
                retry_overload=rc.retry_overload,
                max_retry_after=rc.max_retry_after,
                level=config.level,
                clock=clock,
                listeners=listeners,
            )
    if config.timeout is not None:
        with _at(name, "timeout"):
            timeout = Timeout(
                name=name, clock=clock, listeners=listeners, **kwargs(config.timeout.options())
            )
    if config.chaos is not None:
        with _at(name, "chaos"):
            from floodwall.chaos import chaos_from_spec

            chaos = chaos_from_spec(
                f"{name}.chaos",
                config.chaos.spec(),
                allow=True if allow_chaos else None,  # None: FLOODWALL_CHAOS=1 decides
                clock=clock,
                listeners=listeners,
            )
    ordered: tuple[Policy | None, ...] = (sampled, fallback, cache, breaker, bulkhead, limiter)
    ordered += (adaptive, idempotency, retry, timeout, chaos)  # chaos innermost: the dependency
    return Built(
        tuple(p for p in ordered if p is not None),
        fallback,
        breaker,
        retry,
        timeout,
        bulkhead,
        limiter,
        sampled,
        cache,
        adaptive,
        chaos,
    )


@dataclass(frozen=True)
class Override:
    """An operator's manual setting: what, on which resource or level, until when."""

    target: str
    action: str
    until: float | None
    reason: str
    value: Any = None
    """What the override sets (the rate-limit section of ``set_limit``)."""


class Resource(Pipeline):
    """One named dependency: its level, its config and its live pipeline.

    Holding a ``Resource`` (or a function it decorates) is safe across reloads: every call
    reads the current stages once. A resource runs like the pipeline of its policies, with its
    meter (when metrics are on) as the outermost gate; while its level is shed, only the
    policies that can answer without the dependency run (fallback, cache, backup source),
    around a call that refuses with :class:`DegradedError`.
    """

    kind = "resource"

    def __init__(self, name: str, config: ResourceConfig, registry: Registry) -> None:
        self.name = validate.text("name", name)
        self.config = config
        self.level = config.level
        self._registry = registry
        self.breaker: CircuitBreaker | None = None
        self.retry: Retry | None = None
        self.timeout: Timeout | None = None
        self.fallback: Fallback[Any] | None = None
        self.bulkhead: Bulkhead | HostBulkhead | None = None
        self.limiter: RateLimiter[Any] | GlobalLimiter | None = None
        self.sampled: SampledDrop | None = None
        self.cache: Cache | None = None
        self.adaptive: AdaptiveLimiter | None = None
        self.chaos: ChaosPolicy | None = None
        self.meter: Meter | None = Meter() if registry.metrics else None
        self._metering = None if self.meter is None else Metering(self.meter, self._rejected)
        self.removed = False
        self.use(())

    def use(self, policies: tuple[Policy, ...]) -> None:
        """Run ``policies`` from the next call on (one assignment: a reader sees the old stages
        or the new ones, never a mix)."""
        self.policies = policies
        self.pipeline = Pipeline(*policies, name=self.name)
        answering = tuple(p for p in policies if p.kind in ANSWERING)
        metering = self._metering
        outermost: tuple[Policy, ...] = ()
        observers = self._registry._observers
        if metering is not None and observers:
            # observers see each call begin and end: the meter runs as a gate that calls them
            metering, outermost = None, (_Observed(self, observers),)
        now = self._registry._now
        refuse = (_refuse, self), (_refuse_async, self)
        # The meter is outermost in both plans: a shed call is counted (as shed, or as a
        # degraded answer), so an operator's shed shows in the metrics as it is.
        self._answering = _Answering(self.name, (*outermost, *answering), metering, now)
        shed_sync, shed_async = self._answering._stages, self._answering._async_stages
        self._plans = (
            _stages((*outermost, *policies), metering, now),
            ([refuse[0], *shed_sync], [refuse[1], *shed_async]),
        )
        self.watch(self._registry._attention)

    def watch(self, attention: bool) -> None:
        """Check for shedding on every call while ``attention`` (an operator override is in
        force), else run the normal stages with no check at all."""
        if attention:
            self._use_stages([(_checked_sync, self)], [(_checked_async, self)])
        else:
            self._use_stages(*self._plans[0])

    def answering(self) -> Pipeline:
        """The resource's meter and the policies that answer without the dependency (fallback,
        cache, backup source): what runs while its level is shed, or when a request's deadline
        passed before it was sent, so such a call is answered and counted all the same."""
        return self._answering

    def _rejected(self, outcome: str, error: BaseException) -> None:
        self._registry._rejected(self, outcome, error)

    def _shed_error(self) -> DegradedError:
        return DegradedError(self.name, f"dependency level {self.level} is shed", None)

    def describe(self) -> str:
        return f"Resource({self.name!r}, level={self.level}: {self.pipeline})"


class _Answering(Pipeline):
    """:meth:`Resource.answering`: the answering policies with the resource's meter outermost,
    in its own runner (``metering``) or as the gate :class:`_Observed` (the first policy)."""

    def __init__(
        self,
        name: str,
        policies: tuple[Policy, ...],
        metering: Metering | None,
        now: Callable[[], float],
    ) -> None:
        super().__init__(*policies, name=name)
        self._metered = metering is not None
        if metering is not None:
            self._use_stages(*_stages(policies, metering, now))

    def answering(self) -> Pipeline:
        return self  # already the answering part, its meter included

    def __str__(self) -> str:
        inner = super().__str__()
        return f"Meter({self.name!r}) -> {inner}" if self._metered else inner

    def describe(self) -> str:
        return f"Pipeline({self.name!r}: {self})"


class _Observed(Gate):
    """A resource's meter as its outermost gate, with :class:`~floodwall._core.meter.CallObserver`
    s: each sees every call begin and end (tracing, per-call histograms). Only built while
    observers are installed; the plain meter runs in its own runner (``Metering``), whose
    success path this gate would slow."""

    kind = "meter"

    def __init__(self, resource: Resource, observers: tuple[CallObserver, ...]) -> None:
        assert resource.meter is not None
        self.name = resource.name
        self.listeners = Listeners()
        self._meter = resource.meter
        self._rejected = resource._rejected
        self._now = resource._registry._now
        self._observers = observers

    def admit(
        self, now: float, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Degradation | None, list[object]]:
        begun = []
        for observer in self._observers:
            try:
                begun.append(observer.begin(self.name))
            except Exception:  # noqa: BLE001 - an observer never fails the call
                _log.exception("observer %r failed to begin a call of %s", observer, self.name)
                begun.append(None)
        # the marker before the call: a new one after it means a fallback answered
        return _DEGRADED.get(), begun

    def record(
        self,
        permit: tuple[Degradation | None, list[object]],
        now: float,
        duration: float,
        error: BaseException | None,
        result: Any,
    ) -> None:
        marker, begun = permit
        meter = self._meter
        if error is None:
            current = _DEGRADED.get()
            if current is marker or current is None or current.claimed:
                meter.success(duration)
                outcome, answer = "success", "answer"
            else:
                outcome, answer = meter.degraded(current, duration), "fallback"
        else:
            outcome, answer = meter.failure(error, duration), "error"
            if outcome not in ("error", "cancelled"):
                self._rejected(outcome, error)
        for observer, token in zip(self._observers, begun, strict=True):
            try:
                observer.end(
                    self.name,
                    token,
                    duration=duration,
                    outcome=outcome,
                    answer=answer,
                    error=error,
                )
            except Exception:  # noqa: BLE001 - an observer never fails the call
                _log.exception("observer %r failed to end a call of %s", observer, self.name)

    def describe(self) -> str:
        return f"Meter({self.name!r}, observed)"


def _checked_sync(resource: Resource, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """The one stage of a resource while overrides are in force: shed or not, per call."""
    registry = resource._registry
    stages = resource._plans[registry.is_shed(resource.level)][0]
    return chain(stages, fn)(*args, **kwargs)


async def _checked_async(
    resource: Resource, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Any:
    registry = resource._registry
    stages = resource._plans[registry.is_shed(resource.level)][1]
    return await chain(stages, fn)(*args, **kwargs)


def _refuse(resource: Resource, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """The innermost stage of a shed resource: the dependency is off (a fresh error each call:
    raising one instance again would grow its traceback without bound)."""
    raise resource._shed_error()


async def _refuse_async(
    resource: Resource, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Any:
    raise resource._shed_error()


def _raise(error: BaseException) -> Any:
    raise error


@dataclass
class _Staged:
    """A reload built aside, ready to swap in."""

    document: Document
    stores: dict[str, Store]
    """Every store the new document's resources use: kept ones and new ones."""
    opened: list[Store]
    """Stores connected for this reload (closed again if it is refused)."""
    budgets: dict[str, RetryBudget]
    built: dict[str, tuple[ResourceConfig, Built]]
    """New or changed resources: their config and their policies."""


def _uses(config: ResourceConfig) -> set[str]:
    """The ``stores`` entries a resource's policies use."""
    used: set[str] = set()
    if config.bulkhead is not None and config.bulkhead.scope == "host":
        used.add(config.bulkhead.store)
    if config.rate_limit is not None and config.rate_limit.scope != "local":
        used.add(config.rate_limit.store)
    if config.cache is not None and config.cache.store is not None:
        used.add(config.cache.store)
    if config.idempotency is not None:
        used.add(config.idempotency.store)
    return used


def _moved(old: Document, new: Document) -> set[str]:
    """Store names whose URL a reload changes or removes."""
    return {name for name, url in old.stores.items() if new.stores.get(name) != url}


class Registry:
    """Every resource of a configuration document, built and kept live."""

    def __init__(
        self,
        document: Document | Mapping[str, Any] | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        listeners: Iterable[EventListener] = (),
        metrics: bool = True,
    ) -> None:
        from floodwall.config.loader import parse

        self.metrics = validate.flag("metrics", metrics)
        """Whether resources keep a :class:`~floodwall.observe.Meter` (cumulative outcomes and
        latency, what the Prometheus and OpenTelemetry adapters read)."""
        self.clock = clock
        self.listeners = Listeners(listeners)
        self.document = (
            document if isinstance(document, Document) else parse(document or {}, "<registry>")
        )
        self._lock = threading.RLock()
        self._resources: dict[str, Resource] = {}
        self._budgets: dict[str, RetryBudget] = {}
        self._stores: dict[str, Store] = {}
        self._retired: list[Store] = []
        """Stores the last reload stopped using; closed at the next one, or by :meth:`close`."""
        self._overrides: dict[tuple[str, str], Override] = {}
        self._shed_levels: frozenset[int] = frozenset()
        self._next_expiry = float("inf")
        self._attention = False
        """True while any override is in force: only then does a call check for shedding."""
        self._now = clock.monotonic
        self._sampled: dict[tuple[str, str], list[float]] = {}
        self._observers: tuple[CallObserver, ...] = ()
        try:
            for name, config in self.document.resources.items():
                resource = Resource(name, config, self)
                self._build(resource, config)
                self._resources[name] = resource
        except ConfigError:
            self.close()  # the stores opened for the resources built so far
            raise

    # -- reading ----------------------------------------------------------------------------

    def get(self, name: str) -> Resource:
        """The resource called ``name`` (a policy: call it, await it, decorate with it)."""
        if name.__class__ is not str:
            validate.text("name", name, error=TypeError)
        try:
            return self._resources[name]
        except KeyError:
            known = ", ".join(sorted(self._resources)) or "none"
            raise KeyError(f"no resource named {name!r} (known: {known})") from None

    def __call__(self, name: str) -> Resource:
        """``@registry("payments")`` decorates with that resource's pipeline."""
        return self.get(name)

    def __iter__(self) -> Any:
        return iter(dict(self._resources).values())

    def close(self) -> None:
        """Close the connections of the stores this registry opened for ``stores:`` entries."""
        with self._lock:
            stores, self._stores = [*self._stores.values(), *self._retired], {}
            self._retired = []
        for store in stores:
            store.close()

    def names(self) -> list[str]:
        return sorted(self._resources)

    # -- building ---------------------------------------------------------------------------

    def _budget(self, name: str, config: RetryConfig) -> RetryBudget | None:
        return _new_budget(name, config, self.clock, self._budgets)

    def _store(self, name: str) -> Store:
        """The store a ``stores:`` entry names, connected once and shared."""
        store = self._stores.get(name)
        if store is None:
            store = self._stores[name] = open_store(name, self.document.stores)
        return store

    def _build(self, resource: Resource, config: ResourceConfig) -> None:
        """(Re)build ``resource``'s policies from ``config`` against the running document."""
        built = build(
            resource.name,
            config,
            clock=self.clock,
            budget=self._budget,
            listeners=self.listeners,
            store=self._store,
            allow_chaos=self.document.allow_chaos,
        )
        self._install(resource, config, built)

    def _install(self, resource: Resource, config: ResourceConfig, built: Built) -> None:
        """Swap ``built`` into ``resource``, keeping the live breaker's state (its window, open
        timer and counts), a live-tuned sampled drop and an unchanged cache's entries."""
        if built.breaker is not None and resource.breaker is not None:
            resource.breaker.reconfigure(built.breaker.options)
            built = built.replace(built.breaker, resource.breaker, "breaker")
        if built.sampled is not None and resource.sampled is not None and config.sampled_drop:
            # A live-tuned ratio (the config centre's knob) keeps the policy and its counters.
            resource.sampled.set_ratio(config.sampled_drop.ratio)
            built = built.replace(built.sampled, resource.sampled, "sampled")
        if (
            built.cache is not None
            and resource.cache is not None
            and (resource.config.cache == config.cache)
        ):
            built = built.replace(built.cache, resource.cache, "cache")  # keep its entries
        resource.config = config
        resource.level = config.level
        resource.fallback = built.fallback
        resource.breaker = built.breaker
        resource.retry = built.retry
        resource.timeout = built.timeout
        resource.bulkhead = built.bulkhead
        resource.limiter = built.limiter
        resource.sampled = built.sampled
        resource.cache = built.cache
        resource.adaptive = built.adaptive
        resource.chaos = built.chaos
        resource.use(built.policies)

    # -- reloading --------------------------------------------------------------------------

    def reload(
        self,
        document: Document | Mapping[str, Any] | str,
        source: str = "<reload>",
        *,
        allow_empty: bool = False,
    ) -> None:
        """Apply a new document (a model, a mapping, or text named by ``source``'s extension),
        all or nothing.

        The document is parsed, validated and fully built aside (its stores first, then every
        new or changed resource) before anything running changes; then one swap under the lock
        installs it, and :attr:`document` is the document that runs. On any error nothing
        changes: ``config_rejected`` is emitted, a warning naming ``source`` and the reason is
        logged on ``floodwall.config``, and :class:`ConfigError` is raised.

        An empty document, or one without resources while resources run, is refused like an
        invalid one (it is what a file caught mid-write looks like); ``allow_empty=True``
        drops every resource on purpose.
        """
        validate.text("source", source)
        validate.flag("allow_empty", allow_empty)
        refused: ConfigError | None = None
        with self._lock:  # one reload at a time, and no operator change between stage and swap
            try:
                fresh = self._parse(document, source, allow_empty)
                self._commit(self._stage(fresh))
            except ConfigError as exc:
                refused = exc
        if refused is not None:  # reported outside the lock: listeners may take their time
            self._refuse(source, refused)
            raise refused
        self._emit("config_applied", f"{source}: {len(fresh.resources)} resource(s)")

    def _parse(
        self, document: Document | Mapping[str, Any] | str, source: str, allow_empty: bool
    ) -> Document:
        from floodwall.config.loader import loads, parse

        if isinstance(document, str):
            document = loads(document, source)
        if not isinstance(document, Document) and not document and not allow_empty:
            raise ConfigError(
                f"{source}: the document is empty (a file caught mid-write?); "
                "reload(..., allow_empty=True) drops every resource on purpose"
            )
        fresh = document if isinstance(document, Document) else parse(document, source)
        if not fresh.resources and self._resources and not allow_empty:
            raise ConfigError(
                f"{source}: the document has no resources and would drop all "
                f"{len(self._resources)} running; reload(..., allow_empty=True) does it on purpose"
            )
        return fresh

    def _refuse(self, source: str, exc: ConfigError) -> None:
        """Report a refused document: an event and one log line, both naming the source."""
        reason = str(exc)
        if not reason.startswith(source):
            reason = f"{source}: {reason}"
        _log.warning("configuration refused, the last good one stays: %s", reason)
        self._emit("config_rejected", reason)

    def _stage(self, document: Document) -> _Staged:
        """Build ``document`` aside: every store its resources use, then every new or changed
        resource (with the operator's limit overrides applied), touching nothing that runs."""
        staged = _Staged(document, {}, [], dict(self._budgets), {})
        for name, url in document.stores.items():  # a store kept as is stays connected
            if self.document.stores.get(name) == url and name in self._stores:
                staged.stores[name] = self._stores[name]

        def store(name: str) -> Store:
            held = staged.stores.get(name)
            if held is not None:
                return held
            held = open_store(name, document.stores)
            staged.stores[name] = held
            staged.opened.append(held)
            return held

        def budget(name: str, config: RetryConfig) -> RetryBudget | None:
            return _new_budget(name, config, self.clock, staged.budgets)

        moved = _moved(self.document, document)
        armed = document.allow_chaos != self.document.allow_chaos
        try:
            for name, configured in document.resources.items():
                config = self._overridden(name, configured)
                running = self._resources.get(name)
                if (
                    running is not None
                    and running.config == config
                    and not _uses(config) & moved
                    and not (armed and config.chaos is not None)
                ):
                    continue  # unchanged, and so are its stores and whether its chaos may act
                built = build(  # every error names its path: resources.<name>.<section>
                    name,
                    config,
                    clock=self.clock,
                    budget=budget,
                    listeners=self.listeners,
                    store=store,
                    allow_chaos=document.allow_chaos,
                )
                staged.built[name] = (config, built)
        except ConfigError:
            for opened in staged.opened:
                opened.close()
            raise
        return staged

    def _overridden(self, name: str, config: ResourceConfig) -> ResourceConfig:
        """``config`` with the operator's ``set_limit`` on ``name`` (operators outrank reloads)."""
        override = self._overrides.get((name, "set_limit"))
        if override is None or config.rate_limit is None:
            return config
        return config.model_copy(update={"rate_limit": override.value})

    def _commit(self, staged: _Staged) -> None:
        """Install a staged document in one step (lock held; nothing here can fail)."""
        resources: dict[str, Resource] = {}
        for name in staged.document.resources:
            resource = self._resources.get(name)
            if name in staged.built:
                config, built = staged.built[name]
                if resource is None:
                    resource = Resource(name, config, self)
                self._install(resource, config, built)
            assert resource is not None  # unchanged resources were running
            resources[name] = resource
        for name, resource in self._resources.items():
            if name not in resources:
                resource.removed = True
        kept = {id(store) for store in staged.stores.values()}
        retired = [store for store in self._stores.values() if id(store) not in kept]
        self._resources = resources
        self.document = staged.document
        self._stores = staged.stores
        self._budgets = staged.budgets
        for store in self._retired:
            store.close()  # a reload ago: drained resources had that long to finish
        self._retired = retired

    # -- operators --------------------------------------------------------------------------

    def force_open(self, name: str, *, ttl: float | None = None, reason: str = "") -> None:
        """Force ``name``'s breaker open (until :meth:`clear` or ``ttl`` seconds)."""
        self._breaker_override(name, "force_open", ttl, reason)

    def force_closed(self, name: str, *, ttl: float | None = None, reason: str = "") -> None:
        """Force ``name``'s breaker closed (until :meth:`clear` or ``ttl`` seconds)."""
        self._breaker_override(name, "force_closed", ttl, reason)

    def _breaker_override(self, name: str, action: str, ttl: float | None, reason: str) -> None:
        validate.text("reason", reason, empty=True)
        if ttl is not None:
            validate.seconds("ttl", ttl, positive=True)
        breaker = self.get(name).breaker
        if breaker is None:
            raise ConfigError(f"resources.{name} has no circuit_breaker to {action}")
        text = reason or f"{action.replace('_', ' ')} by operator"
        getattr(breaker, action)(text + (f" for {ttl:g}s" if ttl else ""))
        self._set_override(Override(name, action, self._until(ttl), text))

    def set_limit(
        self,
        name: str,
        rate: str | float,
        *,
        burst: int | None = None,
        ttl: float | None = None,
        reason: str = "",
    ) -> None:
        """Change ``name``'s rate limit live (e.g. ``"50/s"``) until :meth:`clear` or ``ttl``.

        The configured limit comes back when the override ends; a reload in the meantime keeps
        the override in force.
        """
        validate.text("reason", reason, empty=True)
        if burst is not None:
            validate.count("burst", burst, 0)
        resource = self.get(name)
        current = resource.config.rate_limit
        if current is None:
            raise ConfigError(f"resources.{name} has no rate_limit to change")
        try:
            section = RateLimitConfig.model_validate(
                {**current.model_dump(), "rate": rate, "burst": burst}
            )
        except ValidationError as exc:
            raise ConfigError(f"set_limit({name!r}): {exc.errors()[0]['msg']}") from None
        text = reason or f"rate limit set to {rate} by operator"
        until = self._until(ttl)
        with self._lock:
            self._apply_limit(resource, section)
        self._set_override(Override(name, "set_limit", until, text, section))

    def _apply_limit(self, resource: Resource, section: RateLimitConfig) -> None:
        config = resource.config.model_copy(update={"rate_limit": section})
        self._build(resource, config)

    def shed(self, level: int, *, ttl: float | None = None, reason: str = "") -> None:
        """Shed dependency level ``level`` (2 or 3): its calls answer from their fallback."""
        if isinstance(level, bool) or not isinstance(level, int) or level not in (2, 3):
            raise ConfigError(f"level must be 2 or 3 (level 1 is never shed), got {level!r}")
        validate.text("reason", reason, empty=True)
        text = reason or f"level {level} shed by operator"
        with self._lock:
            self._shed_levels = self._shed_levels | {level}
        self._set_override(Override(f"level:{level}", "shed", self._until(ttl), text))

    def clear(self, target: str, action: str | None = None) -> None:
        """End the overrides on ``target`` (a resource name or ``"level:N"``)."""
        validate.text("target", target)
        if action is not None:
            validate.text("action", action)
        with self._lock:
            ended = [k for k in self._overrides if k[0] == target and action in (None, k[1])]
            for key in ended:
                self._end(self._overrides.pop(key))

    def _until(self, ttl: float | None) -> float | None:
        if ttl is None:
            return None
        return self.clock.monotonic() + validate.seconds("ttl", ttl, positive=True)

    def _set_override(self, override: Override) -> None:
        with self._lock:
            self._overrides[(override.target, override.action)] = override
            if override.until is not None:
                self._next_expiry = min(self._next_expiry, override.until)
            self._refresh_attention()
        self._emit("override", f"{override.target}: {override.action} ({override.reason})")

    def _refresh_attention(self) -> None:
        attention = bool(self._shed_levels) or self._next_expiry != float("inf")
        if attention != self._attention:
            self._attention = attention
            for resource in list(self._resources.values()):
                resource.watch(attention)

    def _end(self, override: Override) -> None:
        if override.action == "set_limit":
            resource = self._resources.get(override.target)
            configured = self.document.resources.get(override.target)
            if resource is not None and configured is not None:
                self._build(resource, configured)
            self._emit("override_ended", f"{override.target}: {override.action}")
            return
        if override.action == "shed":
            level = int(override.target.split(":")[1])
            self._shed_levels = self._shed_levels - {level}
            self._refresh_attention()
        else:
            resource = self._resources.get(override.target)
            if resource is not None and resource.breaker is not None:
                resource.breaker.reset(f"override {override.action} ended")
        self._emit("override_ended", f"{override.target}: {override.action}")

    def expire(self) -> None:
        """End every override whose TTL has passed (called on each shed check and by tick)."""
        now = self.clock.monotonic()
        if now < self._next_expiry:
            return
        with self._lock:
            due = [k for k, o in self._overrides.items() if o.until is not None and o.until <= now]
            for key in due:
                self._end(self._overrides.pop(key))
            pending = [o.until for o in self._overrides.values() if o.until is not None]
            self._next_expiry = min(pending, default=float("inf"))
            self._refresh_attention()

    def is_shed(self, level: int) -> bool:
        """Whether calls at ``level`` are being shed now (cheap: checked on every call)."""
        if level.__class__ is not PLAIN_INT:  # resources pass ints; any other query is checked
            validate.count("level", level, 1, 3, error=ValueError)
        if self.clock.monotonic() >= self._next_expiry:
            self.expire()
        return level in self._shed_levels

    def overrides(self) -> list[Override]:
        """The operator overrides in force."""
        self.expire()
        return sorted(self._overrides.values(), key=lambda o: (o.target, o.action))

    # -- observing --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every resource's live state, for dashboards and the admin API."""
        self.expire()
        out: dict[str, dict[str, Any]] = {}
        for name, resource in sorted(self._resources.items()):
            entry: dict[str, Any] = {
                "level": resource.level,
                "shed": resource.level in self._shed_levels,
                "pipeline": str(resource.pipeline),
            }
            if resource.breaker is not None:
                snap = resource.breaker.metrics()
                entry["circuit_breaker"] = {
                    "state": resource.breaker.state.name,
                    "calls": snap.calls,
                    "failure_rate": snap.failure_rate,
                    "slow_call_rate": snap.slow_call_rate,
                    "rejected": resource.breaker.rejected,
                }
            if resource.bulkhead is not None:
                entry["bulkhead"] = {
                    "in_flight": resource.bulkhead.in_flight,
                    "queued": resource.bulkhead.queued,
                    "max_concurrent": resource.bulkhead.options.max_concurrent,
                    "scope": "host" if isinstance(resource.bulkhead, HostBulkhead) else "local",
                }
            limiter = resource.limiter
            if isinstance(limiter, GlobalLimiter):
                entry["rate_limit"] = {
                    "scope": "global",
                    "store": limiter.guard.state,
                    "rejected": limiter.rejected,
                }
            elif limiter is not None:
                entry["rate_limit"] = {"rejected": limiter.rejected}
            if resource.adaptive is not None:
                entry["adaptive"] = {
                    "limit": resource.adaptive.limit,
                    "inflight": resource.adaptive.inflight,
                }
            if resource.retry is not None:
                entry["retry"] = {
                    "calls": resource.retry.calls,
                    "retries": resource.retry.retries,
                    "budget_refusals": resource.retry.budget_refusals,
                }
            out[name] = entry
        return out

    REJECTION_SAMPLE_SECONDS = 1.0
    """At most one ``rejected`` event per resource and outcome in this many seconds."""

    def _rejected(self, resource: Resource, outcome: str, exc: BaseException) -> None:
        """Emit a sampled ``rejected`` event (rejections come in floods during an outage)."""
        if not self.listeners:
            return
        now = self._now()
        key = (resource.name, outcome)
        with self._lock:
            slot = self._sampled.setdefault(key, [float("-inf"), 0.0])
            if now - slot[0] < self.REJECTION_SAMPLE_SECONDS:
                slot[1] += 1
                return
            suppressed = int(slot[1])
            slot[0], slot[1] = now, 0.0
        self.listeners.emit(
            Event(
                "rejected",
                "resource",
                resource.name,
                now,
                str(exc),
                figures={"outcome": outcome, "suppressed_since_last": suppressed},
            )
        )

    def _emit(self, kind: str, reason: str) -> None:
        if self.listeners:
            self.listeners.emit(Event(kind, "registry", "registry", self.clock.monotonic(), reason))

    def add_listener(self, listener: EventListener) -> None:
        self.listeners.add(listener)

    def add_observer(self, observer: CallObserver) -> None:
        """Show ``observer`` every call through every resource, from the next call on (and
        every resource a reload adds): what a tracer or a per-call histogram needs. Costs each
        call the observer's work; the registry's plain meter costs nothing extra."""
        if not all(callable(getattr(observer, m, None)) for m in ("begin", "end")):
            raise TypeError(f"observer must be a CallObserver (begin, end), got {observer!r}")
        if not self.metrics:
            raise ConfigError("add_observer needs a registry with metrics=True (the meter gate)")
        with self._lock:
            self._observers = (*self._observers, observer)
            for resource in self._resources.values():
                resource.use(resource.policies)
