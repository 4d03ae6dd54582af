"""BBR's window mechanics and shell, and the CPU sources (on fake cgroup trees, no OS coupling).

Reference: go-kratos/aegis ratelimit/bbr/bbr.go and bbr_test.go (TestBBRMaxPass,
TestBBRMaxPassWithCache, TestBBRMinRt); CPU smoothing from bbr.go's cpuproc (decay 0.95, 500 ms).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from floodwall import ConfigError, FakeClock, OverloadedError, TimeoutExceeded
from floodwall.adaptive import (
    BBR,
    BBRLimiter,
    CgroupCPU,
    ProcessCPU,
    SmoothedCPU,
    SystemCPU,
    default_cpu_source,
)

MS = 1e-3


def test_max_pass_defaults_to_one_and_skips_the_current_bucket() -> None:
    bbr = BBR(window=1.0, buckets=10)
    assert bbr.max_pass(0.0) == 1
    for i in range(1, 11):
        bbr.add_pass(i * 0.1 - 0.05, i * 100)
    assert bbr.max_pass(1.0) == 1000  # TestBBRMaxPass: the last bucket became "completed"
    fresh = BBR(window=1.0, buckets=10)
    fresh.add_pass(0.01, 50)
    fresh.add_pass(0.06, 50)
    assert fresh.max_pass(0.09) == 1  # TestBBRMaxPassWithCache: not counted while current
    assert fresh.max_pass(0.11) == 100


def test_min_rt_defaults_to_one_resolution_unit_and_old_buckets_expire() -> None:
    bbr = BBR(window=1.0, buckets=10)
    assert bbr.min_rt(0.0) == pytest.approx(1 * MS)
    bbr.record(0.05, 0.004)
    bbr.record(0.05, 0.006)
    assert bbr.min_rt(0.15) == pytest.approx(5 * MS)
    assert bbr.max_pass(0.15) == 2
    assert bbr.min_rt(5.0) == pytest.approx(1 * MS)  # everything aged out
    exact = BBR(window=1.0, buckets=10, rt_resolution=0)
    exact.record(0.05, 0.0042)
    assert exact.min_rt(0.15) == pytest.approx(0.0042)


def test_dropped_completions_count_rt_but_not_pass() -> None:
    bbr = BBR(window=1.0, buckets=10)
    bbr.record(0.05, 0.010, passed=False)
    assert bbr.max_pass(0.15) == 1
    assert bbr.min_rt(0.15) == pytest.approx(10 * MS)


def test_never_drops_a_lone_request() -> None:
    bbr = BBR(window=1.0, buckets=10)
    assert bbr.should_drop(0.5, 1, cpu=1.0) is False
    assert bbr.should_drop(0.5, 2, cpu=1.0) is True  # nothing learned yet: max in-flight 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu_threshold": 0}, "cpu_threshold must be a number in"),
        ({"cooldown": -1}, "cooldown must be a finite number of seconds >= 0"),
        ({"buckets": 1}, "buckets must be an integer in \\[2, "),
        ({"window": 0}, "window must be"),
        ({"rt_resolution": -1}, "rt_resolution must be a finite number of seconds >= 0"),
    ],
)
def test_bbr_options_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BBR(**kwargs)  # type: ignore[arg-type]


def test_limiter_tokens_feed_the_window(clock: FakeClock) -> None:
    limiter = BBRLimiter(window=1.0, buckets=10, cpu=lambda: 0.0, clock=clock)
    for _ in range(30):
        token = limiter.acquire()
        assert token is not None
        clock.advance(0.005)
        assert token.success() is True
        assert token.success() is False  # released once
    clock.advance(0.2)
    stats = limiter.stats()
    assert stats.max_pass >= 10
    assert stats.min_rt == pytest.approx(5 * MS)
    assert stats.inflight == 0
    assert "BBRLimiter" in limiter.describe()


def test_limiter_shells_raise_overloaded_with_retry_after(clock: FakeClock) -> None:
    events: list[object] = []
    limiter = BBRLimiter(cpu=lambda: 0.95, clock=clock, listeners=[events.append])
    assert limiter.call(lambda: "a") == "a"  # a lone request always passes
    holders = [limiter.acquire() for _ in range(2)]
    with pytest.raises(OverloadedError) as info:
        limiter.call(lambda: "b")
    assert info.value.retry_after == 1.0
    assert limiter.dropped == 1
    assert events and "cpu 95%" in str(events[0])
    for holder in holders:
        assert holder is not None
        holder.dropped()

    def times_out() -> None:
        raise TimeoutExceeded("x", 1.0)

    with pytest.raises(TimeoutExceeded):
        BBRLimiter(cpu=lambda: 0.0, clock=clock).call(times_out)


async def test_limiter_async_shell(clock: FakeClock) -> None:
    limiter = BBRLimiter(cpu=lambda: 0.0, clock=clock)

    async def work() -> int:
        return 7

    assert await limiter.call_async(work) == 7
    hot = BBRLimiter(cpu=lambda: 1.0, clock=clock)
    tokens = [hot.acquire(), hot.acquire()]
    with pytest.raises(OverloadedError):
        await hot.call_async(work)
    for token in tokens:
        assert token is not None
        with token:
            pass


# -- CPU ----------------------------------------------------------------------------------------


def test_smoothed_cpu_is_kratos_ema(clock: FakeClock) -> None:
    readings = iter([0.0, 1.0, 1.0, 0.5])
    smoothed = SmoothedCPU(lambda: next(readings), clock=clock)
    assert smoothed() == 0.0  # before the first 500 ms
    clock.advance(0.5)
    assert smoothed() == pytest.approx(0.05)  # 0 * 0.95 + 1.0 * 0.05
    clock.advance(0.2)
    assert smoothed() == pytest.approx(0.05)  # between samples: unchanged
    clock.advance(0.8)  # 1.5 s: two intervals passed since the last sample
    assert smoothed() == pytest.approx(0.05 * 0.95**2 + 1.0 * (1 - 0.95**2))


def test_smoothed_cpu_validates() -> None:
    with pytest.raises(ConfigError, match="decay must be a number in"):
        SmoothedCPU(lambda: 0.0, decay=1.0)
    with pytest.raises(ConfigError, match="interval must be"):
        SmoothedCPU(lambda: 0.0, interval=0)


def test_cgroup_v2_usage_against_quota(tmp_path: Path, clock: FakeClock) -> None:
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    stat = tmp_path / "cpu.stat"
    stat.write_text("usage_usec 1000000\nuser_usec 1\n")
    source = CgroupCPU(tmp_path, clock=clock)
    assert source.available and source.has_quota and source.cores == 2.0
    assert source() == 0.0
    stat.write_text("usage_usec 2000000\n")
    clock.advance(1.0)
    assert source() == pytest.approx(0.5)  # 1 CPU-second in 1 s over a 2-core quota


def test_cgroup_v1_without_quota_uses_the_cores(tmp_path: Path, clock: FakeClock) -> None:
    (tmp_path / "cpuacct").mkdir()
    (tmp_path / "cpu").mkdir()
    usage = tmp_path / "cpuacct" / "cpuacct.usage"
    usage.write_text("0\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    source = CgroupCPU(tmp_path, quota_cores=4.0, clock=clock)
    assert source.available and not source.has_quota
    source()
    usage.write_text(str(2 * 10**9))
    clock.advance(1.0)
    assert source() == pytest.approx(0.5)


def test_cgroup_missing_is_unavailable(tmp_path: Path) -> None:
    source = CgroupCPU(tmp_path)
    assert not source.available
    assert source() == 0.0


def test_process_and_system_sources_return_fractions() -> None:
    process = ProcessCPU()
    assert process() == 0.0
    assert 0.0 <= process() <= 1.0
    system = SystemCPU(use_psutil=False)
    if system.available:
        system()
        assert 0.0 <= system() <= 1.0
    assert 0.0 <= default_cpu_source()() <= 1.0
    with pytest.raises(ConfigError, match="cores must be a finite number > 0"):
        ProcessCPU(cores=0)
