"""The HTML report, opened in headless Chromium: it draws every chart, with fault windows shaded
and breaker states, reaches for nothing outside the file, and logs no error.

Chromium and chromedriver come from Debian (``apt-get install chromium chromium-driver``),
selenium from pip. Without them this test fails and says which is missing: a report nobody has
seen rendered is not tested.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from floodwall.drill.metrics import (
    Action,
    EventLog,
    FaultWindow,
    Request,
    Sample,
    compute,
)
from floodwall.drill.report import CHART_KINDS, ScenarioReport, write_html
from floodwall.drill.runner import RunResult

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.xdist_group("drill"),  # real servers and real time: one drill at a time
]

CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,2400",
)


def synthetic_run(mode: str, protected: bool) -> RunResult:
    """20 s of requests on two routes; reviews faulty from 5 s to 12 s."""
    requests = []
    for k in range(400):
        t = k * 0.05
        during = 5 <= t < 12
        healthy_ok = protected or not during
        requests.append(
            Request(
                2 * k, "/product", t, t + (0.05 if healthy_ok else 2.0), 200 if healthy_ok else 0
            )
        )
        requests.append(
            Request(
                2 * k + 1,
                "/reviews",
                t,
                t + 0.06,
                200 if protected or not during else 0,
                degraded=protected and during,
            )
        )
    actions = []
    if protected:
        actions = [
            Action(5.3, "fallback", "fallback", "reviews.fallback"),
            Action(5.6, "state_change", "circuit_breaker", "reviews", "OPEN"),
            Action(12.6, "state_change", "circuit_breaker", "reviews", "HALF_OPEN"),
            Action(12.7, "state_change", "circuit_breaker", "reviews", "CLOSED"),
        ]
    samples = [Sample(t / 4, 3, 40, 60.0, 5 if protected else 100, 0) for t in range(80)]
    log = EventLog(
        routes={"/product": ("product",), "/reviews": ("reviews",)},
        timeout=2.0,
        warmup=1.0,
        load_end=20.0,
        end=20.5,
        requests=requests,
        actions=actions,
        faults=[FaultWindow("reviews", 5.0, 12.0, "latency +5s")],
        samples=samples,
    )
    protection = {"reviews": "Fallback(value=[]) -> CircuitBreaker('reviews') -> call"}
    return RunResult("story", mode, log, compute(log), protection if protected else {})


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = [synthetic_run("unprotected", False), synthetic_run("protected", True)]
    single = [synthetic_run("protected", True)]
    reports = [
        ScenarioReport("story", "reviews slows down </script><b>", runs, workers=100),
        ScenarioReport("again", "one mode only", single, workers=100),
    ]
    return write_html(tmp_path_factory.mktemp("html") / "report.html", reports)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(
            "Chromium is unavailable (chromium: "
            f"{chromium or 'missing'}, chromedriver: {driver or 'missing'}); install it with "
            "`apt-get install chromium chromium-driver`"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        pytest.fail(f"selenium is unavailable ({exc}); `pip install selenium`")
    options = webdriver.ChromeOptions()
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.binary_location = chromium
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()


def test_the_report_renders_every_chart(report: Path, browser: Any, tmp_path: Path) -> None:
    browser.get(report.as_uri())
    assert browser.execute_script("return document.body.dataset.rendered") == "true"
    charts = browser.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart')).map(function (svg) {"
        "  return {kind: svg.dataset.kind, mode: svg.dataset.mode,"
        "    series: Array.from(svg.querySelectorAll('path.series'))"
        "      .map(function (p) { return p.getAttribute('d').length; }),"
        "    faults: svg.querySelectorAll('rect.fault').length,"
        "    states: Array.from(svg.querySelectorAll('rect.state'))"
        "      .map(function (r) { return r.getAttribute('class'); }),"
        "    width: svg.getBoundingClientRect().width};"
        "});"
    )
    assert len(charts) == 3 * len(CHART_KINDS)  # 2 runs + 1 run, every kind each
    assert [c["kind"] for c in charts[: len(CHART_KINDS) * 2 : 2]] == list(CHART_KINDS)
    for chart in charts:
        assert chart["faults"] == 1, chart  # the fault window, shaded
        assert chart["width"] > 100
        if chart["kind"] in ("success", "latency", "workers"):
            assert chart["series"] and min(chart["series"]) > 100, chart
    breakers = [c for c in charts if c["kind"] == "breakers" and c["mode"] == "protected"]
    assert breakers and all("state state-OPEN" in c["states"] for c in breakers)
    assert "state state-HALF_OPEN" in breakers[0]["states"]
    tables = browser.execute_script("return document.querySelectorAll('table.figures').length")
    assert tables == 2
    heading = browser.execute_script("return document.querySelector('section p').textContent")
    assert heading == "reviews slows down </script><b>"  # escaped, not markup

    fetched = browser.execute_script("return performance.getEntriesByType('resource').length")
    assert fetched == 0  # self-contained: nothing loaded from anywhere
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    svg = browser.find_element(By.CSS_SELECTOR, "svg.chart[data-kind=success]")
    ActionChains(browser).move_to_element(svg).perform()
    tooltip = browser.execute_script(
        "return Array.from(arguments[0].querySelectorAll('text'))"
        ".map(function (t) { return t.textContent; }).filter(function (t) {"
        " return t.indexOf('healthy') >= 0; })",
        svg,
    )
    assert tooltip and "s: healthy" in tooltip[0]

    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
