"""Every figure of a drill, computed from its raw event log and nothing else.

A run records what happened as plain events (:class:`EventLog`): each edge request as the
caller saw it, each call that reached a mock service, each action the protection took (the
floodwall events at the edge), each fault window, each applied write (the ledgers) and resource
samples. :func:`compute` turns a log into :class:`Figures`; the definitions below are the
contract (docs/drills.md repeats them):

* windows, by request **arrival** time: *before* = ``[warmup, first fault start)``, *during* =
  ``[first fault start, last fault end)``; a fault without ``until`` ends when the load ends;
* **healthy routes**: routes none of whose dependencies has a fault; *affected* routes: the
  others;
* a request **succeeds** when the caller got a 2xx before its timeout; it is **full** when it
  succeeded without a fallback answering for part of it (no ``X-Degraded``);
* **p99**: nearest-rank 99th percentile of the latencies of all requests in the window, failed
  ones included (a request without an answer counts the caller's timeout);
* **blast radius**: healthy routes' success rate and p99, before vs during;
* **first protective action** (``first_action_s``): first fault start → the first action of the
  protection at the edge about a faulty dependency at or after it, of any kind: a fallback
  answering, a rejection (open breaker, full bulkhead, rate limit, shed), a timeout firing, a
  breaker opening. ``None``: nothing at all;
* **detection time** (``detection_time_s``): first fault start → the first time the protection
  took the faulty dependency out of the path: a breaker about it opening (``OPEN`` or
  ``FORCED_OPEN``) or load shed (a dependency level shed, an adaptive shedder refusing).
  ``None``: it never did;
* **recovery time**: last fault end → the earliest ``t`` (0.1 s steps) such that the full-answer
  rate of the requests arriving in each of :data:`RECOVERY_HOLD` back-to-back windows of
  :data:`RECOVERY_WINDOW` seconds from ``end + t`` on is within 1 percentage point of its
  *before* value (back, and staying back). ``None``: not within the run;
* **data consistency** (the ledger audit), per ledger (a service that received writes) and per
  order id (the write's key) on it: *doubled* = applied more than once on that ledger; *lost* =
  the caller was told the order succeeded but that ledger never applied it; *unconfirmed*
  (charged, told failed) = the caller saw a failure but that ledger applied it (the money moved,
  the answer did not). An order written once to each of two ledgers is neither; the run's
  ``doubled_writes``, ``lost_writes`` and ``unconfirmed_writes`` add the ledgers' up;
* **amplification** of a dependency: calls that reached it carrying the id of an edge request,
  per edge request whose route uses it (arrivals *during* the fault for ``amplification``, the
  whole run for ``amplification_by_dependency``); 1.0 = one call per request, above = retries,
  below = calls the protection kept away;
* **resources**: peaks of the samples (threads, open sockets, resident memory, edge workers
  busy and queued), process-wide, and the event loop's worst lag (how late a 0.25 s sleep
  woke up: the machine's share of the latency figures);
* **CPU wait** (``cpu_wait_share_before``, ``cpu_wait_share_during``): the seconds the run's
  threads were ready to run but waited for a core (Linux's run-queue wait), per second, in the
  worst :data:`CPU_WAIT_SPAN` of the *before* and the *during* window;
* **void**: the run measured the machine, not the system, when the load generator sent its
  arrivals late (the 99th percentile of how late each arrival left, ``send_lag_p99_ms``, above
  :data:`VOID_SEND_LAG` of the caller's timeout) or the event loop stalled
  (``peak_loop_lag_ms`` above :data:`VOID_LOOP_LAG` of the caller's timeout), or the machine
  took the CPU away (CPU wait above :data:`VOID_CPU_WAIT` before or during the fault), or when
  the healthy routes failed more than :data:`VOID_BASELINE` of their requests *before* the first
  fault (the system could not carry its load before anything was broken: no fault to compare
  with); ``void`` says why, and a comparison with such a run gives no verdict.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CONTAINING",
    "CPU_WAIT_SPAN",
    "DEFINITIONS",
    "DETECTING",
    "RECOVERY_HOLD",
    "RECOVERY_STEP",
    "RECOVERY_TOLERANCE",
    "RECOVERY_WINDOW",
    "VOID_BASELINE",
    "VOID_CPU_WAIT",
    "VOID_LOOP_LAG",
    "VOID_SEND_LAG",
    "Action",
    "Call",
    "EventLog",
    "FaultWindow",
    "Figures",
    "LedgerAudit",
    "Request",
    "Sample",
    "Series",
    "Write",
    "compute",
    "cpu_wait_share",
    "percentile",
    "series",
    "void_reason",
]

RECOVERY_WINDOW = 2.0
"""Seconds of arrivals whose full-answer rate must be back for recovery to count."""
RECOVERY_HOLD = 2
"""Back-to-back windows the full-answer rate must stay back for (so 4 s): a rate back for one
window and lost again is no recovery."""
RECOVERY_TOLERANCE = 0.01
"""How far below its *before* value the full-answer rate may be and count as recovered."""
RECOVERY_STEP = 0.1
"""Resolution of the recovery time, seconds."""
DETECTING = frozenset({"fallback", "rejected", "timeout", "shed", "level_shed"})
"""Event kinds that count as a protective action (plus a breaker opening)."""
CONTAINING = frozenset({"level_shed", "shed"})
"""Event kinds that take a dependency out of the path like a breaker opening does (plus a
shedder's refusal: a ``rejected`` event of a ``load_shedder``)."""
_OPEN_STATES = frozenset({"OPEN", "FORCED_OPEN"})
DEFINITIONS = (
    (
        "first protective action",
        "fault start to the protection's first action about the faulty dependency, of any "
        "kind (a fallback, a rejection, a timeout, a breaker opening)",
    ),
    (
        "detection",
        "fault start to the faulty dependency taken out of the path (its breaker opening, or "
        "load shed)",
    ),
    (
        "recovery",
        "fault end to full answers back within 1 point of their rate before the fault, and "
        "staying back for 2 windows of 2 s",
    ),
    (
        "doubled / lost / charged, told failed",
        "per ledger and per order: applied twice or more; told success, never applied; told "
        "failure, applied",
    ),
    (
        "void",
        "the load left later than 10 % of the caller's timeout (p99), the event loop fell "
        "25 % of it behind, the run waited for a core over half of a second before or during "
        "the fault, or over 5 % of the healthy requests failed before the fault: the run "
        "measured the machine, and its comparison gives no verdict",
    ),
)
"""One line per figure, the same words as docs/drills.md: printed under the command line's
table and in the HTML report, so every place that shows a figure says what it is."""
VOID_SEND_LAG = 0.1
"""Share of the caller's timeout: a run whose load generator sent its arrivals later than this
at the 99th percentile is void (the modes did not get the same load; 200 ms for a 2 s
timeout)."""
VOID_LOOP_LAG = 0.25
"""Share of the caller's timeout: a run whose event loop fell further behind than this is void
(its timeouts and latencies measured the machine; 500 ms for a 2 s timeout)."""
VOID_BASELINE = 0.05
"""Share of the healthy routes' requests *before* the first fault that may fail: above it the
run is void (its baseline was broken before any fault, so nothing during the fault can be
compared with it). The drills' own systems fail none of them on a machine that keeps up; the
profile example's 15 % seen on a busy CI machine was its services starved at start-up."""
VOID_CPU_WAIT = 0.5
"""Seconds the run's threads may wait for a core, ready to run, in the worst second
(:data:`CPU_WAIT_SPAN`) of the *before* or the *during* window: above it the run is void (its
latencies measured the machine). Measured on the quick demo's protected product page (load 5
to 9 on 2 cores): quiet runs 0.20 to 0.36; runs whose healthy p99 grew past the demo's bound
with the event loop kept 90 % busy for 3 s of the fault 0.53 (134 -> 315 ms, loop lag 48 ms)
and 0.80 (127 -> 486 ms, lag 177 ms); a busy loop whose p99 stayed within it (129 -> 167 ms)
0.44. Under ``stress-ng --cpu 2``: 0.86 next to load 7 (void by its late load too), 0.29 next
to load 4 (valid, p99 153 -> 127 ms): the fair scheduler gives a mostly idle loop its turns."""
CPU_WAIT_SPAN = 1.0
"""Seconds over which run-queue wait is taken (the worst such span of a window counts): a
latency p99 is made by the worst moments of a window, and a 3 s starvation in a 7 s fault
shows at a third of its strength over the whole window."""


@dataclass(frozen=True, slots=True)
class Request:
    """One edge request as its caller saw it; times in seconds since the run started.

    ``status`` is the HTTP status, ``0`` when no answer came before the caller's timeout, ``-1``
    when the connection failed. ``order`` is a write's order id.
    """

    id: int
    route: str
    start: float
    end: float
    status: int
    degraded: bool = False
    order: str | None = None
    late: float = 0.0
    """Seconds the load generator sent it after its scheduled time."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def full(self) -> bool:
        return self.ok and not self.degraded

    @property
    def latency(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Call:
    """One request that reached a mock service (``end`` is ``None`` if it never finished)."""

    service: str
    start: float
    end: float | None
    status: int
    request: int | None = None


@dataclass(frozen=True, slots=True)
class Action:
    """Something the protection did (a floodwall event at the edge)."""

    time: float
    kind: str
    source: str
    name: str
    to_state: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """A fault on ``target`` from ``start`` to ``end`` seconds."""

    target: str
    start: float
    end: float
    what: str


@dataclass(frozen=True, slots=True)
class Sample:
    """Resources at ``time``: threads, open sockets, resident MB, edge workers and queue, how
    late the sampler woke (``loop_lag``, seconds: the run's event loop falling behind), and the
    seconds the run's threads had so far waited for a core while ready to run (``cpu_wait``,
    cumulative; ``None`` where the system does not say)."""

    time: float
    threads: int
    sockets: int
    rss_mb: float
    workers_busy: int = 0
    queued: int = 0
    loop_lag: float = 0.0
    cpu_wait: float | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """One write a service applied (one line of its ledger)."""

    service: str
    time: float
    order: str
    key: str | None = None
    request: int | None = None


@dataclass
class EventLog:
    """Everything a run recorded. ``routes`` maps each route to the dependencies it calls;
    ``timeout`` is the caller's; ``load_end`` when arrivals stopped; ``end`` when the run did."""

    routes: dict[str, tuple[str, ...]]
    timeout: float
    warmup: float
    load_end: float
    end: float
    requests: list[Request] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    faults: list[FaultWindow] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)


@dataclass(frozen=True)
class Figures:
    """A run's figures (``None`` where a figure does not apply or was not reached)."""

    requests: int
    success_rate: float | None
    healthy_routes: tuple[str, ...]
    faulty: tuple[str, ...]
    fault_start: float | None
    fault_end: float | None
    healthy_success_rate_before: float | None
    healthy_success_rate: float | None
    healthy_p99_ms_before: float | None
    healthy_p99_ms_during: float | None
    healthy_failures: dict[str, int]
    """What the healthy routes' failed requests during the fault got: HTTP status -> count
    (``"0"``: no answer before the caller's timeout, ``"-1"``: connection failed)."""
    first_action_s: float | None
    first_action_by: str | None
    detection_time_s: float | None
    detected_by: str | None
    recovery_time_s: float | None
    full_rate_before: float | None
    accepted_writes: int | None
    applied_writes: int | None
    doubled_writes: int | None
    lost_writes: int | None
    unconfirmed_writes: int | None
    audit: dict[str, dict[str, Any]]
    """The ledger audit per ledger (service): ``orders`` (write requests it was part of),
    ``applied`` (its lines), ``doubled``, ``lost``, ``unconfirmed`` and the order ids of each."""
    amplification: float | None
    amplification_by_dependency: dict[str, float]
    peak_threads: int | None
    peak_sockets: int | None
    peak_rss_mb: float | None
    peak_workers_busy: int | None
    peak_queued: int | None
    peak_loop_lag_ms: float | None
    """How far behind the run's event loop fell at worst: above ~100 ms the machine was too
    busy for the latency figures to be the system's alone."""
    send_lag_p99_ms: float | None
    """How late the load generator sent its arrivals, 99th percentile."""
    cpu_wait_share_before: float | None
    """Seconds the run's threads waited for a core while ready to run, per second, in the worst
    second of the *before* window (``None`` without ``/proc``)."""
    cpu_wait_share_during: float | None
    """The same in the worst second of the fault."""
    void: str | None
    """Why this run's figures cannot be compared (see the module), or ``None``."""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (floats rounded to what the table shows and a bit more)."""
        return {k: _rounded(v) for k, v in asdict(self).items()}


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_rounded(v) for v in value]
    return value


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def _rate(requests: Iterable[Request], full: bool = False) -> float | None:
    total = good = 0
    for request in requests:
        total += 1
        good += request.full if full else request.ok
    return good / total if total else None


def _between(requests: Iterable[Request], start: float, end: float) -> list[Request]:
    return [r for r in requests if start <= r.start < end]


def _p99_ms(requests: Sequence[Request]) -> float | None:
    value = percentile([r.latency for r in requests], 0.99)
    return None if value is None else value * 1000


def fault_span(log: EventLog) -> tuple[float, float] | None:
    """``(first fault start, last fault end)``, or ``None`` without faults."""
    if not log.faults:
        return None
    return min(f.start for f in log.faults), max(f.end for f in log.faults)


def faulty_dependencies(log: EventLog) -> tuple[str, ...]:
    return tuple(sorted({f.target for f in log.faults}))


def healthy_routes(log: EventLog) -> tuple[str, ...]:
    faulty = set(faulty_dependencies(log))
    return tuple(r for r, deps in log.routes.items() if not faulty.intersection(deps))


def _relates(name: str, targets: Iterable[str]) -> bool:
    return any(name == t or name.startswith(t + ".") for t in targets)


def _opens(action: Action) -> bool:
    return action.kind == "state_change" and action.to_state in _OPEN_STATES


def _acts(action: Action) -> bool:
    return action.kind in DETECTING or _opens(action)


def _contains(action: Action) -> bool:
    shedder = action.kind == "rejected" and action.source == "load_shedder"
    return _opens(action) or action.kind in CONTAINING or shedder


def _first(log: EventLog, counts: Any) -> tuple[float | None, str | None]:
    """Seconds from the first fault's start to the first action ``counts`` accepts about a
    faulty dependency, and a description of that action."""
    span = fault_span(log)
    if span is None:
        return None, None
    start = span[0]
    targets = [t for t in faulty_dependencies(log) if t != "edge"]
    for action in sorted(log.actions, key=lambda a: a.time):
        if action.time < start or action.source == "chaos" or not counts(action):
            continue
        if not targets or _relates(action.name, targets) or action.kind == "level_shed":
            what = f"{action.kind} {action.source}[{action.name}]"
            if action.to_state:
                what += f" -> {action.to_state}"
            return action.time - start, what
    return None, None


def first_action(log: EventLog) -> tuple[float | None, str | None]:
    """Seconds from the first fault's start to the first protective action of any kind about a
    faulty dependency (see [Chaos drills][guide-drills]), and what it was."""
    return _first(log, _acts)


def detection(log: EventLog) -> tuple[float | None, str | None]:
    """Seconds from the first fault's start until the protection took a faulty dependency out
    of the path (a breaker opening, load shed; see [Chaos drills][guide-drills]), and how."""
    return _first(log, _contains)


def recovery(log: EventLog, baseline: float | None) -> float | None:
    """Seconds from the last fault's end until the full-answer rate is back and stays back for
    :data:`RECOVERY_HOLD` windows (see [Chaos drills][guide-drills])."""
    span = fault_span(log)
    if span is None or baseline is None:
        return None
    end = span[1]
    ordered = sorted(log.requests, key=lambda r: r.start)
    starts = [r.start for r in ordered]
    held = RECOVERY_WINDOW * RECOVERY_HOLD
    steps = int((log.load_end - end - held) / RECOVERY_STEP + 1e-9)

    def back(t: float) -> bool:
        lo, hi = bisect_left(starts, t), bisect_left(starts, t + RECOVERY_WINDOW)
        if hi == lo:
            return False
        rate = sum(r.full for r in ordered[lo:hi]) / (hi - lo)
        return rate >= baseline - RECOVERY_TOLERANCE - 1e-12

    for step in range(max(steps, -1) + 1):
        t = end + step * RECOVERY_STEP
        if all(back(t + k * RECOVERY_WINDOW) for k in range(RECOVERY_HOLD)):
            return round(step * RECOVERY_STEP, 6)
    return None


@dataclass(frozen=True)
class LedgerAudit:
    """One ledger's audit: the orders (write keys) it was part of, and which of them it applied
    twice or more (``doubled``), never although the caller was told success (``lost``), or
    although the caller was told failure (``unconfirmed``: charged, told failed)."""

    service: str
    orders: int
    applied: int
    doubled: tuple[str, ...]
    lost: tuple[str, ...]
    unconfirmed: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "orders": self.orders,
            "applied": self.applied,
            "doubled": len(self.doubled),
            "lost": len(self.lost),
            "unconfirmed": len(self.unconfirmed),
            "doubled_orders": list(self.doubled),
            "lost_orders": list(self.lost),
            "unconfirmed_orders": list(self.unconfirmed),
        }


def audit(log: EventLog) -> dict[str, LedgerAudit]:
    """Compare what callers were told with what each ledger applied, per ledger and per order
    id: a write request is part of the ledger of every dependency its route calls."""
    told: dict[str, bool] = {}
    routes: dict[str, str] = {}
    for request in log.requests:
        if request.order is not None:
            told[request.order] = told.get(request.order, False) or request.ok
            routes[request.order] = request.route
    applied: dict[str, Counter[str]] = defaultdict(Counter)
    for write in log.writes:
        applied[write.service][write.order] += 1
    ledgers = {d for order, route in routes.items() for d in log.routes.get(route, ())}
    out = {}
    for service in sorted(ledgers | set(applied)):
        lines = applied.get(service, Counter())
        mine = sorted(o for o, r in routes.items() if service in log.routes.get(r, ()))
        out[service] = LedgerAudit(
            service,
            orders=len(mine),
            applied=sum(lines.values()),
            doubled=tuple(sorted(o for o, n in lines.items() if n > 1)),
            lost=tuple(o for o in mine if told[o] and not lines[o]),
            unconfirmed=tuple(o for o in mine if not told[o] and lines[o]),
        )
    return out


def _windows(log: EventLog) -> tuple[tuple[float, float], tuple[float, float] | None]:
    """The *before* window and the *during* one (``None`` without faults)."""
    span = fault_span(log)
    return (log.warmup, span[0] if span else log.load_end), span


def cpu_wait_share(log: EventLog, start: float, end: float) -> float | None:
    """The worst :data:`CPU_WAIT_SPAN` from ``start`` to ``end`` for the run's threads: seconds
    they waited for a core while ready to run, per second (the growth of the samples'
    ``cpu_wait`` between two samples at least that far apart, over the time between them; the
    whole span if shorter). ``None``: fewer than two samples there say (no ``/proc``)."""
    inside = (s for s in log.samples if start <= s.time < end)
    points = sorted((s.time, s.cpu_wait) for s in inside if s.cpu_wait is not None)
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    span = min(CPU_WAIT_SPAN, points[-1][0] - points[0][0])
    worst, j = 0.0, 0
    for t0, w0 in points:
        while j < len(points) and points[j][0] - t0 < span - 1e-9:
            j += 1
        if j == len(points):
            break
        t1, w1 = points[j]
        worst = max(worst, (w1 - w0) / (t1 - t0))
    return worst


def _starved(log: EventLog) -> str | None:
    """The void reason of a run whose threads waited for a core over :data:`VOID_CPU_WAIT` in a
    second of the *before* or the *during* window (the load after warm-up, without faults), or
    ``None``."""
    before, during = _windows(log)
    first = "before the fault" if during else "under load"
    for name, window in ((first, before), ("during the fault", during)):
        share = None if window is None else cpu_wait_share(log, *window)
        if share is not None and share > VOID_CPU_WAIT:
            return (
                f"the run's threads waited for a core {share * 1000:.0f} ms in a second {name} "
                f"(more than {VOID_CPU_WAIT * 1000:.0f} ms): the machine took the CPU away, and "
                "latencies measured it"
            )
    return None


def void_reason(log: EventLog) -> str | None:
    """Why the run's figures cannot be compared with another run's, or ``None`` (see the
    module: the load generator sent late, the event loop stalled, the run waited for a core, or
    the healthy routes failed before any fault)."""
    late = percentile([r.late for r in log.requests], 0.99)
    bound = VOID_SEND_LAG * log.timeout
    if late is not None and late > bound:
        return (
            f"the load generator sent its arrivals late ({late * 1000:.0f} ms at the 99th "
            f"percentile, more than {bound * 1000:.0f} ms): the machine, not the system, set "
            "the pace"
        )
    lag = max((s.loop_lag for s in log.samples), default=0.0)
    bound = VOID_LOOP_LAG * log.timeout
    if lag > bound:
        return (
            f"the event loop fell {lag * 1000:.0f} ms behind (more than {bound * 1000:.0f} "
            "ms): timeouts and latencies measured the machine"
        )
    return _starved(log) or _broken_baseline(log)


def _broken_baseline(log: EventLog) -> str | None:
    """The void reason of a run whose healthy routes failed over :data:`VOID_BASELINE` of
    their requests before the first fault, or ``None`` (also without faults: no baseline)."""
    span = fault_span(log)
    if span is None:
        return None
    healthy = set(healthy_routes(log))
    before = [r for r in _between(log.requests, log.warmup, span[0]) if r.route in healthy]
    failed = sum(not r.ok for r in before)
    if not before or failed <= VOID_BASELINE * len(before):
        return None
    return (
        f"the healthy routes failed {failed} of their {len(before)} requests before any fault "
        f"({failed / len(before) * 100:.0f} %, more than {VOID_BASELINE * 100:.0f} %): the "
        "system could not carry its load on this machine, and there is no baseline to compare "
        "the fault with"
    )


def amplification(log: EventLog, window: tuple[float, float] | None = None) -> dict[str, float]:
    """Calls that reached each dependency per edge request whose route uses it (arrivals in
    ``window``, default the whole run). Calls are matched to requests by request id."""
    lo, hi = window if window is not None else (-math.inf, math.inf)
    requests = [r for r in log.requests if lo <= r.start < hi]
    calls_by_request: dict[str, Counter[int]] = defaultdict(Counter)
    for call in log.calls:
        if call.request is not None:
            calls_by_request[call.service][call.request] += 1
    out: dict[str, float] = {}
    dependencies = sorted({d for deps in log.routes.values() for d in deps})
    for dependency in dependencies:
        users = [r for r in requests if dependency in log.routes.get(r.route, ())]
        if not users:
            continue
        counter = calls_by_request.get(dependency, Counter())
        out[dependency] = sum(counter[r.id] for r in users) / len(users)
    return out


def compute(log: EventLog) -> Figures:
    """Every figure of a run from its event log (the definitions: [Chaos drills][guide-drills])."""
    span = fault_span(log)
    healthy = set(healthy_routes(log))
    faulty = faulty_dependencies(log)
    first = span[0] if span else log.load_end
    before = _between(log.requests, log.warmup, first)
    during = _between(log.requests, *span) if span else []
    healthy_before = [r for r in before if r.route in healthy]
    healthy_during = [r for r in during if r.route in healthy]
    acted, action = first_action(log)
    detected, how = detection(log)
    full_before = _rate(before, full=True)
    books = audit(log)
    wrote = any(r.order is not None for r in log.requests)
    accepted = {r.order for r in log.requests if r.order is not None and r.ok}
    late = percentile([r.late for r in log.requests], 0.99)
    amp_during = amplification(log, span) if span else {}
    faulty_amp = [amp_during[d] for d in faulty if d in amp_during]
    samples = log.samples
    before_window, during_window = _windows(log)
    return Figures(
        requests=len(log.requests),
        success_rate=_rate(log.requests),
        healthy_routes=tuple(sorted(healthy)),
        faulty=faulty,
        fault_start=span[0] if span else None,
        fault_end=span[1] if span else None,
        healthy_success_rate_before=_rate(healthy_before),
        healthy_success_rate=_rate(healthy_during) if span else None,
        healthy_p99_ms_before=_p99_ms(healthy_before),
        healthy_p99_ms_during=_p99_ms(healthy_during) if span else None,
        healthy_failures=dict(Counter(str(r.status) for r in healthy_during if not r.ok)),
        first_action_s=acted,
        first_action_by=action,
        detection_time_s=detected,
        detected_by=how,
        recovery_time_s=recovery(log, full_before),
        full_rate_before=full_before,
        accepted_writes=len(accepted) if wrote else None,
        applied_writes=len(log.writes) if wrote else None,
        doubled_writes=sum(len(b.doubled) for b in books.values()) if wrote else None,
        lost_writes=sum(len(b.lost) for b in books.values()) if wrote else None,
        unconfirmed_writes=sum(len(b.unconfirmed) for b in books.values()) if wrote else None,
        audit={service: b.as_dict() for service, b in books.items()},
        amplification=max(faulty_amp) if faulty_amp else None,
        amplification_by_dependency=amplification(log),
        peak_threads=max((s.threads for s in samples), default=None),
        peak_sockets=max((s.sockets for s in samples), default=None),
        peak_rss_mb=max((s.rss_mb for s in samples), default=None),
        peak_workers_busy=max((s.workers_busy for s in samples), default=None),
        peak_queued=max((s.queued for s in samples), default=None),
        peak_loop_lag_ms=max((s.loop_lag * 1000 for s in samples), default=None),
        send_lag_p99_ms=None if late is None else late * 1000,
        cpu_wait_share_before=cpu_wait_share(log, *before_window),
        cpu_wait_share_during=cpu_wait_share(log, *during_window) if during_window else None,
        void=void_reason(log),
    )


# -- time series for charts ------------------------------------------------------------------


@dataclass
class Series:
    """Per-bin values over a run for the report's charts (``None``: no request in the bin)."""

    step: float
    t: list[float] = field(default_factory=list)
    healthy_success: list[float | None] = field(default_factory=list)
    affected_success: list[float | None] = field(default_factory=list)
    full_rate: list[float | None] = field(default_factory=list)
    healthy_p50_ms: list[float | None] = field(default_factory=list)
    healthy_p99_ms: list[float | None] = field(default_factory=list)
    affected_p99_ms: list[float | None] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)
    workers_busy: list[int | None] = field(default_factory=list)
    queued: list[int | None] = field(default_factory=list)
    breakers: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)
    faults: list[tuple[float, float, str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: _rounded(v) for k, v in asdict(self).items()}


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def series(log: EventLog, step: float = 0.5) -> Series:
    """Bin the log by arrival time in ``step``-second bins, for charts."""
    healthy = set(healthy_routes(log))
    bins = max(1, math.ceil(log.end / step))
    by_bin: list[list[Request]] = [[] for _ in range(bins)]
    for request in log.requests:
        index = min(bins - 1, max(0, int(request.start / step)))
        by_bin[index].append(request)
    out = Series(step=step)
    samples = sorted(log.samples, key=lambda s: s.time)
    cursor = 0
    for index, requests in enumerate(by_bin):
        t = index * step
        good = [r for r in requests if r.route in healthy]
        bad = [r for r in requests if r.route not in healthy]
        out.t.append(t)
        out.healthy_success.append(_rate(good))
        out.affected_success.append(_rate(bad))
        out.full_rate.append(_rate(requests, full=True))
        out.healthy_p50_ms.append(_ms(percentile([r.latency for r in good], 0.5)))
        out.healthy_p99_ms.append(_ms(percentile([r.latency for r in good], 0.99)))
        out.affected_p99_ms.append(_ms(percentile([r.latency for r in bad], 0.99)))
        out.throughput.append(len(requests) / step)
        while cursor + 1 < len(samples) and samples[cursor + 1].time <= t + step:
            cursor += 1
        sample = samples[cursor] if samples and samples[cursor].time <= t + step else None
        out.workers_busy.append(None if sample is None else sample.workers_busy)
        out.queued.append(None if sample is None else sample.queued)
    out.breakers = breaker_intervals(log.actions, log.end)
    out.faults = [(f.start, f.end, f.target, f.what) for f in log.faults]
    return out


def breaker_intervals(
    actions: Iterable[Action], end: float
) -> dict[str, list[tuple[float, float, str]]]:
    """Each breaker's states as ``(start, end, state)`` intervals, from its state changes
    (a breaker is CLOSED until its first change)."""
    changes: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for action in sorted(actions, key=lambda a: a.time):
        if action.kind == "state_change" and action.to_state and action.source != "chaos":
            changes[action.name].append((action.time, action.to_state))
    out: dict[str, list[tuple[float, float, str]]] = {}
    for name, items in sorted(changes.items()):
        spans: list[tuple[float, float, str]] = []
        state, since = "CLOSED", 0.0
        for time, to_state in items:
            if time > since:
                spans.append((since, time, state))
            state, since = to_state, time
        spans.append((since, max(end, since), state))
        out[name] = spans
    return out
