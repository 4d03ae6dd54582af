"""Reloads are all or nothing: built aside, swapped at once, refused whole, never torn."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import floodwall as fw
from floodwall.config import Registry, loads, parse
from floodwall.config.sources import FileSource

BASE = {"resources": {"a": {"retry": {"attempts": 2}}, "b": {"circuit_breaker": {}}}}


def rejected(events: list[fw.Event]) -> list[str]:
    return [e.reason for e in events if e.kind == "config_rejected"]


@pytest.mark.parametrize("text", ["", "\n", "# nothing yet\n", "{}\n"])
def test_an_empty_document_is_refused_and_named(
    text: str, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[fw.Event] = []
    registry = Registry(BASE, listeners=[events.append])
    before = registry.document
    with caplog.at_level(logging.WARNING, "floodwall.config"), pytest.raises(fw.ConfigError):
        registry.reload(text, "x.yaml")
    assert registry.names() == ["a", "b"]
    assert registry.document is before
    assert len(rejected(events)) == 1
    assert rejected(events)[0].startswith("x.yaml: the document is empty")
    assert [r.getMessage() for r in caplog.records] == [
        f"configuration refused, the last good one stays: {rejected(events)[0]}"
    ]


def test_dropping_every_resource_takes_the_explicit_flag() -> None:
    registry = Registry(BASE)
    with pytest.raises(fw.ConfigError, match="would drop all 2 running"):
        registry.reload({"resources": {}}, "x.yaml")
    assert registry.names() == ["a", "b"]
    registry.reload({"resources": {}}, "x.yaml", allow_empty=True)
    assert registry.names() == []
    assert registry.document.resources == {}
    empty = Registry()
    empty.reload({"stores": {"default": "memory://"}})  # nothing runs, so nothing is dropped
    assert empty.names() == []


def test_a_reload_adding_a_store_and_its_user_applies_whole() -> None:
    registry = Registry(BASE)
    fresh = {
        **BASE,
        "stores": {"default": "memory://", "shared": "memory://"},
        "resources": {
            **BASE["resources"],
            "ledger": {"idempotency": {"store": "shared"}},
            "quota": {"rate_limit": {"rate": "5/s", "scope": "global", "store": "shared"}},
        },
    }
    registry.reload(fresh, "x.yaml")
    assert registry.names() == ["a", "b", "ledger", "quota"]
    assert registry.document == parse(fresh)
    assert registry.get("ledger").call(lambda: 7) == 7
    assert registry.get("quota").call(lambda: 8) == 8
    assert registry._stores["shared"] is registry.get("quota").limiter.store  # type: ignore[union-attr]


def test_a_resource_that_cannot_be_built_refuses_the_whole_document() -> None:
    registry = Registry(BASE)
    before = registry.document
    a = registry.get("a")
    pipeline = a.pipeline
    bad = {
        "resources": {
            "a": {"retry": {"attempts": 5}},  # valid, and would change a
            "b": {"circuit_breaker": {}},
            "c": {"adaptive": {"algorithm": "aimd", "options": {"no_such_option": 1}}},
        }
    }
    with pytest.raises(fw.ConfigError, match=r"resources\.c\.adaptive: options for aimd"):
        registry.reload(bad)
    assert registry.document is before
    assert registry.names() == ["a", "b"]
    assert a.pipeline is pipeline
    assert a.retry is not None
    assert a.retry.attempts == 2


def test_an_unknown_store_scheme_refuses_before_anything_changes() -> None:
    registry = Registry(BASE)
    bad = {
        "stores": {"default": "memory://", "shared": "carrier-pigeon://loft"},
        "resources": {**BASE["resources"], "ledger": {"idempotency": {"store": "shared"}}},
    }
    with pytest.raises(
        fw.ConfigError,
        match=r"resources\.ledger\.idempotency\.store: stores\.shared cannot be opened: store url",
    ):
        registry.reload(bad)
    assert registry.names() == ["a", "b"]
    missing = {"resources": {**BASE["resources"], "ledger": {"idempotency": {"store": "gone"}}}}
    with pytest.raises(fw.ConfigError, match="no store named 'gone'"):
        registry.reload(missing)
    assert registry.names() == ["a", "b"]


def test_a_moved_store_rebuilds_its_users_and_the_old_one_closes_a_reload_later() -> None:
    doc: dict[str, Any] = {
        "stores": {"default": "memory://", "shared": "memory://one"},
        "resources": {"ledger": {"idempotency": {"store": "shared"}}, "a": {}},
    }
    registry = Registry(doc)
    registry.get("ledger").call(lambda: 1)
    old = registry._stores["shared"]
    closed: list[str] = []
    old.close = lambda: closed.append("one")  # type: ignore[method-assign]
    ledger = registry.get("ledger")
    before = ledger.pipeline
    moved = {**doc, "stores": {"default": "memory://", "shared": "memory://two"}}
    registry.reload(moved)
    assert ledger.pipeline is not before  # same config, new store: rebuilt
    assert registry._stores["shared"] is not old
    assert registry._stores["shared"].url == "memory://two"
    assert closed == []  # drained handles may still be using it
    registry.reload({**moved, "resources": {**moved["resources"], "b": {}}})
    assert closed == ["one"]


def test_a_limit_override_survives_a_reload_that_is_built_aside() -> None:
    clock = fw.FakeClock()
    registry = Registry({"resources": {"api": {"rate_limit": {"rate": "100/s"}}}}, clock=clock)
    registry.set_limit("api", "2/s")
    registry.reload({"resources": {"api": {"rate_limit": {"rate": "200/s"}}, "b": {}}})
    api = registry.get("api")
    assert api.config.rate_limit is not None
    assert api.config.rate_limit.rate == "2/s"
    registry.clear("api")
    assert api.config.rate_limit is not None
    assert api.config.rate_limit.rate == "200/s"


GOOD = """\
stores:
  default: memory://{extra_store}
resources:
  a:
    retry: {{attempts: {attempts}}}
    circuit_breaker: {{minimum_calls: {calls}, failure_rate: 0.5}}
  b:
    bulkhead: {{max_concurrent: {width}}}
    rate_limit: {{rate: 100000/s}}
{extra}"""


def good(i: int) -> str:
    extra, store = "", ""
    if i % 3 == 0:  # every third good version adds a store and a resource using it
        store = f"\n  shared{i}: memory://"
        extra = f"  ledger{i}:\n    idempotency: {{store: shared{i}}}\n"
    return GOOD.format(
        attempts=1 + i % 4, calls=5 + i, width=1 + i % 7, extra_store=store, extra=extra
    )


def test_200_rewrites_under_traffic_keep_the_last_good_document(tmp_path: Path) -> None:
    path = tmp_path / "floodwall.yaml"
    last_good = good(0)
    path.write_text(last_good)
    events: list[fw.Event] = []
    registry = Registry(parse(loads(last_good, str(path))), listeners=[events.append])
    source = FileSource(path, registry)
    stop = threading.Event()
    calls = [0]
    failures: list[BaseException] = []

    def traffic(name: str) -> None:
        while not stop.is_set():
            try:
                registry.get(name).call(lambda: None)
                calls[0] += 1
                time.sleep(0)  # hand the GIL over: the file writer and poller run meanwhile
            except fw.RejectedError:
                pass  # a narrow bulkhead may refuse; the resource was there
            except BaseException as exc:  # every other failure is the finding
                failures.append(exc)
                return

    threads = [threading.Thread(target=traffic, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    kinds: dict[str, int] = {}
    try:
        for i in range(1, 201):
            kind = ("good", "empty", "truncated", "half", "invalid")[i % 5]
            kinds[kind] = kinds.get(kind, 0) + 1
            text = good(i)
            if kind == "good":
                path.write_text(text)
                last_good = text
            elif kind == "empty":
                path.write_text("")
            elif kind == "truncated":  # cut mid-line, in the middle of a resource's settings
                path.write_text(text[: text.index("max_concurrent") + 5])
            elif kind == "invalid":
                path.write_text(text.replace("attempts: ", "attempts: -"))
            else:  # a writer without atomic rename, caught between two writes
                with path.open("w", encoding="utf-8") as writer:
                    writer.write(text[: len(text) // 2])
                    writer.flush()
                    source.poll()
                    source.poll()
                    writer.write(text[len(text) // 2 :])
                last_good = text
            for _ in range(3):
                source.poll()
            assert registry.document == parse(loads(last_good, str(path))), (i, kind)
            assert registry.names() == sorted(registry.document.resources)
            for name, config in registry.document.resources.items():
                assert registry.get(name).config == config
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert failures == []
    assert calls[0] > 0
    assert kinds == {"good": 40, "empty": 40, "truncated": 40, "half": 40, "invalid": 40}
    assert source.reloads == 80  # every good and every completed half-written version
    refusals = rejected(events)
    assert all(reason.startswith(str(path)) for reason in refusals)
    why = {
        "empty": "the document is empty",
        "cut short": "the last line has no newline",
        "invalid": "resources.a.retry.attempts: must be an integer >= 1",
    }
    seen = {k: sum(text in reason for reason in refusals) for k, text in why.items()}
    # each version once; the half-written ones were refused while they stood half done
    assert seen == {"empty": 40, "cut short": 80, "invalid": 40}
    assert len(refusals) == 160


def test_arming_chaos_rebuilds_the_resources_it_reaches(monkeypatch: pytest.MonkeyPatch) -> None:
    from floodwall.chaos import InjectedFault

    monkeypatch.delenv("FLOODWALL_CHAOS", raising=False)
    doc: dict[str, Any] = {"resources": {"a": {"chaos": {"exception": True}}, "b": {}}}
    registry = Registry(doc)
    assert registry.get("a").call(lambda: 1) == 1  # inert: the document does not allow it
    registry.reload({**doc, "allow_chaos": True})
    with pytest.raises(InjectedFault):
        registry.get("a").call(lambda: 1)
    registry.reload(doc)
    assert registry.get("a").call(lambda: 1) == 1


def test_a_file_source_refuses_bytes_that_are_not_text_and_keeps_polling(tmp_path: Path) -> None:
    path = tmp_path / "floodwall.yaml"
    path.write_text("resources: {a: {}}\n")
    events: list[fw.Event] = []
    registry = Registry(fw.config.load(path), listeners=[events.append])
    source = FileSource(path, registry)
    path.write_bytes(b"resources: {a: {}, b: {}}\n# \xff\xfe\n")
    assert not source.poll()
    assert not source.poll()
    assert source.last_error is not None
    assert "not UTF-8 text" in source.last_error
    assert rejected(events) == [source.last_error]
    assert registry.names() == ["a"]
    path.write_text("resources: {a: {}, b: {}}\n")
    assert not source.poll()
    assert source.poll()
    assert registry.names() == ["a", "b"]


def test_settle_false_applies_at_first_sight(tmp_path: Path) -> None:
    path = tmp_path / "floodwall.yaml"
    path.write_text("resources: {a: {}}\n")
    registry = Registry(fw.config.load(path))
    source = FileSource(path, registry, settle=False)
    path.write_text("resources: {a: {}, b: {}}\n")
    assert source.poll()
    assert registry.names() == ["a", "b"]
    path.write_text("resources: {a: {}, b: {}, c: {retry: {attempts: 2")  # cut short
    assert not source.poll()
    assert source.last_error is not None
    assert "the last line has no newline" in source.last_error
    assert registry.names() == ["a", "b"]
