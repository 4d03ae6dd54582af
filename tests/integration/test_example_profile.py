"""The profile example end to end: ``examples/profile/run.py --quick`` starts Redis, three
FastAPI services and the gateway on loopback, drills them through the gateway, prints the
demo's table and stops every process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from floodwall.drill.report import ROWS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.xdist_group("drill"),  # real servers and real time: one drill at a time
]

RUN = Path(__file__).resolve().parents[2] / "examples" / "profile" / "run.py"
BOUND = 90.0
"""Seconds the quick run may take on a loaded machine (about 20 s alone)."""


def listening(url: str) -> bool:
    host, port = url.removeprefix("http://").removeprefix("redis://").split("/")[0].split(":")
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, int(port))) == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], Path]:
    folder = tmp_path_factory.mktemp("profile")
    command = [sys.executable, str(RUN), "--quick", "--json", str(folder / "figures.json")]
    command += ["--html", str(folder / "report.html")]
    env = {k: v for k, v in os.environ.items() if k != "FLOODWALL_CHAOS"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    try:
        output, _ = process.communicate(timeout=BOUND)
    finally:
        if process.poll() is None:  # SIGTERM lets it stop its own children first
            os.kill(process.pid, signal.SIGTERM)
            process.communicate(timeout=30)
    figures = json.loads((folder / "figures.json").read_text())
    # A run whose figures measured the machine (load sent late, event loop stalled, healthy
    # routes failing before the fault) is void: no verdict, exit 1, and its figures not judged.
    void = figures["profile_page"]["external"]["void"]
    assert process.returncode == (1 if void else 0), output
    assert figures["expect"]["void"] is bool(void)
    if void:
        assert "no verdict (profile_page): the comparison is void" in output, output
        print(f"void on this machine, figures not judged: {void}")
    return output, figures, folder


def test_the_protected_page_survives_slow_posts(run: tuple[str, dict[str, Any], Path]) -> None:
    _, figures, _ = run
    page = figures["profile_page"]["external"]
    assert page["healthy_routes"] == ["/profile/42/card", "/users/42"]
    if page["void"]:
        assert figures["expect"]["failed"] == []  # nothing judged
        return
    assert page["healthy_success_rate"] >= 0.99
    assert page["success_rate"] >= 0.99  # the page itself too, without its posts for a while
    # the profile service's own policies on posts, via its agent: its timeout acts at once,
    # its breaker opens once the failures outweigh the window's successes
    assert page["first_action_s"] is not None and page["first_action_s"] <= 1.0
    assert "[posts]" in page["first_action_by"]
    assert page["detection_time_s"] is not None and page["detection_time_s"] <= 4.0
    assert "[posts]" in page["detected_by"]
    assert page["recovery_time_s"] is not None
    # one call per request from the gateway and to users; posts' breaker kept calls away
    by_dependency = page["amplification_by_dependency"]
    assert by_dependency["profile"] == pytest.approx(1.0, abs=0.02)
    assert by_dependency["users"] == pytest.approx(1.0, abs=0.05)
    assert page["amplification"] < 0.95
    assert figures["expect"] == {
        "failed": [],
        "checked": {
            "external": {
                "healthy_success_rate": ">= 0.99",
                "success_rate": ">= 0.99",
                "first_action_s": "<= 1",
                "detection_time_s": "<= 4",
            }
        },
        "void": False,
    }


def test_the_global_limits_were_kept_in_redis(run: tuple[str, dict[str, Any], Path]) -> None:
    output, figures, _ = run
    limits = figures["global_limits"]
    assert isinstance(limits, dict)
    assert not limits["redis"].endswith(":6379/0")  # its own Redis, never the machine's
    assert limits["script_calls"]["evalsha"] >= 100  # gateway routes and the profile's quota
    assert "global rate limits in Redis:" in output


def test_it_prints_the_demos_table_and_stops_everything(
    run: tuple[str, dict[str, Any], Path],
) -> None:
    output, figures, folder = run
    for label, _ in ROWS:
        assert label in output
    assert "every expectation met" in output or figures["expect"]["void"]
    assert (folder / "report.html").stat().st_size > 10_000
    urls = re.findall(r"^(?:redis|users|posts|profile|gateway)\s+(\S+)", output, re.MULTILINE)
    assert len(urls) == 5
    assert not [url for url in urls if listening(url)]
