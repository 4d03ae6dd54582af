"""The public surface: names, typing marker, errors."""

from __future__ import annotations

import importlib.resources
import pickle
import types

import floodwall as fw


def test_all_is_complete_and_importable() -> None:
    public = {
        name
        for name in dir(fw)
        if not name.startswith("_") and not isinstance(getattr(fw, name), types.ModuleType)
    }
    assert set(fw.__all__) >= public - {"annotations", "TYPE_CHECKING"}
    for name in fw.__all__:
        assert hasattr(fw, name), name


def test_package_is_typed() -> None:
    assert importlib.resources.files("floodwall").joinpath("py.typed").is_file()


def test_rejections_share_one_root_and_pickle() -> None:
    errors: list[fw.RejectedError] = [
        fw.CircuitOpenError("b", fw.CircuitState.OPEN, 1.5),
        fw.TimeoutExceeded("t", 2.0),
        fw.RateLimitedError("r", "10/s exceeded", 0.1),
        fw.BulkheadFullError("bh", "20 in flight"),
    ]
    for error in errors:
        assert isinstance(error, fw.FloodwallError)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert copy.kind == error.kind
    assert [e.kind for e in errors] == ["circuit_open", "timeout", "rate_limited", "bulkhead_full"]
    assert isinstance(errors[1], TimeoutError)
    assert errors[0].retry_after == 1.5
