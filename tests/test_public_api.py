"""The public surface: names, typing marker, errors."""

from __future__ import annotations

import importlib.resources
import pickle
import types
from typing import Any

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


OPTIONS_OBJECTS = {
    "floodwall.adaptive": (
        "AIMDOptions",
        "VegasOptions",
        "GradientOptions",
        "Gradient2Options",
        "BBROptions",
        "DagorOptions",
        "ThrottleOptions",
        "AdaptiveLimiterOptions",
    ),
    "floodwall.ratelimit": (
        "WindowOptions",
        "TokenBucketOptions",
        "GCRAOptions",
        "LeakyBucketOptions",
        "WarmUpOptions",
        "KeyedOptions",
    ),
    "floodwall.shared": (
        "GlobalLimitOptions",
        "LeaseOptions",
        "TimeSliceOptions",
        "FrequencyOptions",
        "CacheOptions",
        "IdempotencyOptions",
    ),
    "floodwall.degrade": (
        "SampledDropOptions",
        "PriorityGateOptions",
        "ShedOptions",
        "LevelReserve",
    ),
    "floodwall.fallback": ("FallbackOptions",),
    "floodwall.hedge": ("HedgeOptions",),
    "floodwall.chaos": ("ChaosOptions",),
    "floodwall.breaker": ("BreakerOptions",),
    "floodwall.bulkhead": ("BulkheadOptions",),
    "floodwall.timeout": ("TimeoutOptions",),
    "floodwall.retry": ("RetryOptions",),
}
"""Issue 16: each policy's options object, exported beside the policy."""


def test_options_objects_are_exported_frozen_and_checked() -> None:
    import dataclasses
    import importlib

    for module_name, names in OPTIONS_OBJECTS.items():
        module = importlib.import_module(module_name)
        for name in names:
            assert name in module.__all__, f"{module_name}.{name}"
            options: Any = getattr(module, name)
            assert dataclasses.is_dataclass(options), name
            assert getattr(options, "__dataclass_params__").frozen, name  # noqa: B009
            fields = {f.name for f in dataclasses.fields(options) if f.init}
            assert set(getattr(options, "CHECKS")) <= fields, name  # noqa: B009
