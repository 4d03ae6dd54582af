"""Issue 16: one outcome vocabulary. ``Outcomes`` selects errors by type and kind; every option
that says which outcomes count (breaker ``record``/``ignore``, retry ``retry_on``/``business``,
adaptive ``drop_on``, ``on``/``kinds`` of fallback, cache and fallback source) is a spelling of
it, checked here against a tiny reference model of the vocabulary."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import floodwall as fw
from floodwall._core.outcome import ANY_ERROR, Kind, kind_of
from floodwall.adaptive import FixedLimit
from floodwall.classify import DEFAULT_CLASSIFIER, ErrorClass
from floodwall.degrade import FallbackSource
from floodwall.shared import Cache


class Declined(Exception):
    """A business error of the caller's own."""


ERRORS: list[BaseException] = [
    ValueError("bad"),
    Declined("card"),
    ConnectionError("reset"),
    TimeoutError("socket"),
    fw.TimeoutExceeded("t", 1.0),
    fw.CircuitOpenError("b", fw.CircuitState.OPEN, 1.0),
    fw.BulkheadFullError("bh", "full"),
    fw.RateLimitedError("r", "10/s", 0.1),
    asyncio.CancelledError(),
    KeyboardInterrupt(),
]
TYPES: list[type[BaseException]] = [ValueError, Declined, ConnectionError, TimeoutError, OSError]
KINDS = ["error", "timeout", "rejected", "circuit_open", "bulkhead_full", "rate_limited"]


def model_kinds(exc: BaseException) -> set[str]:
    """The reference: every kind name an error has, from the vocabulary's definitions."""
    if isinstance(exc, TimeoutError):
        names = {"timeout"}
    elif isinstance(exc, fw.RejectedError):
        names = {"rejected"}
    elif isinstance(exc, Exception):
        names = {"error"}
    else:
        names = set()  # cancellation, interpreter exits: no kind
    if isinstance(exc, fw.RejectedError):
        names.add(exc.kind)
    return names


def model_selects(types: tuple[type[BaseException], ...], kinds: set[str], exc: Any) -> bool:
    return any(isinstance(exc, t) for t in types) or bool(kinds & model_kinds(exc))


selections = st.tuples(
    st.lists(st.sampled_from(TYPES), max_size=3).map(tuple),
    st.sets(st.sampled_from(KINDS), max_size=3),
)


@given(selections, st.sampled_from(ERRORS))
def test_outcomes_select_as_the_reference_model(
    selection: tuple[tuple[type[BaseException], ...], set[str]], exc: BaseException
) -> None:
    types, kinds = selection
    assert fw.Outcomes(types, frozenset(kinds)).error(exc) == model_selects(types, kinds, exc)


@pytest.mark.parametrize("exc", ERRORS, ids=lambda e: type(e).__name__)
def test_kind_of_is_the_models_coarse_kind(exc: BaseException) -> None:
    coarse = model_kinds(exc) & {"error", "timeout", "rejected"}
    expected = {"timeout": Kind.TIMEOUT, "rejected": Kind.REJECTED}.get(
        next(iter(coarse), "error"), Kind.FAILURE
    )
    assert kind_of(exc) is expected


@given(selections, st.sampled_from(ERRORS))
def test_every_which_outcomes_option_spells_the_same_selection(
    selection: tuple[tuple[type[BaseException], ...], set[str]], exc: BaseException
) -> None:
    """The same ``Outcomes`` given to each option selects the same errors everywhere."""
    types, kinds = selection
    chosen = fw.Outcomes(types, frozenset(kinds))
    expected = model_selects(types, kinds, exc)
    assert fw.Fallback(0, on=chosen).handles(exc) == expected
    assert Cache(on=chosen).handled.error(exc) == expected
    assert FallbackSource(lambda: 0, on=chosen).handled.error(exc) == expected
    # breaker: an ignored error counts nowhere; record decides for plain errors only
    ignored = fw.CircuitBreaker(ignore=chosen).classify(exc) is Kind.IGNORED
    assert ignored == (expected or not isinstance(exc, Exception))
    if kind_of(exc) is Kind.FAILURE:
        assert (fw.CircuitBreaker(record=chosen).classify(exc) is Kind.FAILURE) == expected
    # adaptive limiter: selected errors are drop samples, others release without one
    limiter = fw.AdaptiveLimiter(FixedLimit(4), drop_on=chosen)
    token = limiter.acquire()
    assert token is not None
    token.close(exc)
    assert repr(token).startswith("<Token dropped" if expected else "<Token ignored")


@given(selections, st.sampled_from(ERRORS[:3]))
def test_retry_on_and_business_move_an_error_between_classes(
    selection: tuple[tuple[type[BaseException], ...], set[str]], exc: BaseException
) -> None:
    """``business=`` wins over every class; ``retry_on=`` makes an unknown error transient."""
    types, kinds = selection
    chosen = fw.Outcomes(types, frozenset(kinds))
    expected = model_selects(types, kinds, exc)
    default = DEFAULT_CLASSIFIER.classify(exc)
    business = fw.Retry(business=chosen, budget=None)
    judged = business._judge(exc, None)[0]
    assert judged is (ErrorClass.BUSINESS if expected else default)
    retry_on = fw.Retry(retry_on=chosen, budget=None)
    judged = retry_on._judge(exc, None)[0]
    widened = expected and default is ErrorClass.UNKNOWN
    assert judged is (ErrorClass.TRANSIENT if widened else default)


def test_documented_spellings_mean_the_outcomes_they_name() -> None:
    """The option names in the docs keep working: types, a tuple of types, or kinds."""
    assert fw.Fallback(0, on=KeyError).handled == fw.Outcomes((KeyError,))
    assert fw.Fallback(0, kinds={"timeout"}).handled == fw.Outcomes(kinds=frozenset({"timeout"}))
    both = fw.Fallback(0, on=(KeyError,), kinds={"circuit_open"}).handled
    assert both == fw.Outcomes((KeyError,), frozenset({"circuit_open"}))
    assert fw.Fallback(0).handled is ANY_ERROR
    assert fw.CircuitBreaker(ignore=Declined).options.ignore == fw.Outcomes((Declined,))
    assert fw.CircuitBreaker().options.record == ANY_ERROR
    assert fw.Retry(retry_on=(ValueError,), budget=None).retry_on == fw.Outcomes((ValueError,))
    drops = fw.AdaptiveLimiter(FixedLimit(1)).drop_on
    assert drops == fw.Outcomes(kinds=frozenset({"timeout", "rejected"}))
    # the default drop_on keeps its documented meaning: timeouts and rejections
    assert drops.error(TimeoutError()) and drops.error(fw.BulkheadFullError("b", "full"))
    assert not drops.error(ValueError())


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: fw.CircuitBreaker(record=42), "record must be an exception type"),  # type: ignore[arg-type]
        (lambda: fw.CircuitBreaker(ignore="KeyError"), "ignore must be an exception type"),  # type: ignore[arg-type]
        (lambda: fw.Retry(retry_on=[ValueError]), "retry_on must be an exception type"),  # type: ignore[arg-type]
        (lambda: fw.Fallback(0, kinds="timeout"), "kinds must be a collection of kinds"),
        (lambda: fw.Fallback(0, kinds={"transient"}), "error classes are Retry's"),
        (lambda: fw.Fallback(0, kinds={"success"}), "kinds must name error kinds, got 'success'"),
        (lambda: fw.Outcomes(kinds=frozenset({""})), "kinds items must be a non-empty string"),
        (lambda: fw.Outcomes(result=3), "result must be a predicate on the result, got 3"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_spelling_names_the_option(build: Any, message: str) -> None:
    with pytest.raises(fw.ConfigError, match=message):
        build()


def test_result_predicate_selects_values() -> None:
    failed = fw.Outcomes(result=lambda r: r == 503)
    assert failed.value(503) and not failed.value(200)
    assert not fw.Outcomes().value(503)
    assert not fw.Outcomes() and failed and ANY_ERROR
