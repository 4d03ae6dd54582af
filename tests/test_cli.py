"""The ``floodwall`` command line: versions, check-config on both kinds of file, exit statuses.

One rule for every subcommand, as ``--help`` states it: 0 ok, 1 a check failed, 2 usage error
or invalid input.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import floodwall
from floodwall.cli import FAILED, INVALID, OK, app
from floodwall.gateway.cli import gateway_sections, is_gateway_document

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GATEWAY = """\
upstreams: {app: {endpoints: ['http://127.0.0.1:9001']}}
routes: [{match: {path_prefix: /}, upstream: app}]
resources: {app: {timeout: 1s}}
"""


def invoke(*args: str) -> tuple[int, str]:
    """Exit status and output with whitespace collapsed (rich wraps at the terminal width)."""
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


def write(tmp_path: Path, text: str, name: str = "doc.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_statuses_are_the_documented_ones() -> None:
    assert (OK, FAILED, INVALID) == (0, 1, 2)
    status, output = invoke("--help")
    assert status == OK
    assert "Exit status: 0 ok; 1 a check failed" in output
    assert "--install-completion" in output  # typer's shell completion


def test_version_option_and_command() -> None:
    assert invoke("--version") == (OK, f"floodwall {floodwall.__version__}")
    assert invoke("-V") == (OK, f"floodwall {floodwall.__version__}")
    assert invoke("version") == (OK, floodwall.__version__)


def test_check_config_reads_a_library_file() -> None:
    status, output = invoke("check-config", str(EXAMPLES / "floodwall.yaml"))
    assert status == OK, output
    assert "valid:" in output and "resource(s)" in output
    assert "pipeline:" in output


def test_check_config_tells_a_gateway_file_by_its_sections(tmp_path: Path) -> None:
    status, output = invoke("check-config", str(EXAMPLES / "gateway.yaml"))
    assert status == OK, output
    assert "gateway on" in output and "route(s)" in output
    assert "Extra inputs are not permitted" not in output
    status, output = invoke("check-config", "--gateway", write(tmp_path, GATEWAY))
    assert status == OK, output
    assert "1 route(s), 1 upstream(s), 1 resource(s)" in output


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "the document is empty"),
        ("# only a comment\n", "the document is empty"),
        ("{}\n", "the document is empty"),
        ("resources: []\n", "resources: must be a mapping of resource names"),
        ("resources: {}\n", "resources: no resource is configured"),
        ("defaults: {timeout: 1s}\n", "resources: no resource is configured"),
        ("resources: {a: {retry: {attempts: 0}}}\n", "resources.a.retry.attempts"),
        ("resources: {a: [\n", "not a valid document"),
        ("- just\n- a list\n", "the document must be a mapping"),
    ],
)
def test_check_config_refuses(tmp_path: Path, text: str, said: str) -> None:
    status, output = invoke("check-config", write(tmp_path, text))
    assert status == FAILED, output
    assert "invalid:" in output and said in output


def test_check_config_refuses_binary_and_prints_messages_literally(tmp_path: Path) -> None:
    binary = tmp_path / "doc.yaml"
    binary.write_bytes(b"\xff\xfe\x00resources")
    status, output = invoke("check-config", str(binary))
    assert (status, "not UTF-8 text" in output) == (FAILED, True)
    status, output = invoke(
        "check-config", write(tmp_path, "resources: {'[bold]x': {retry: {attempts: 0}}}\n")
    )
    assert status == FAILED
    assert "resources.[bold]x" in output.replace(" ", "")  # as written, not read as markup


def test_check_config_as_gateway_refuses_a_library_file_and_a_bad_gateway(
    tmp_path: Path,
) -> None:
    status, output = invoke("check-config", "--gateway", str(EXAMPLES / "floodwall.yaml"))
    assert status == FAILED
    assert "routes: no route is configured" in output
    bad = write(tmp_path, GATEWAY.replace("upstream: app", "upstream: nowhere"))
    status, output = invoke("check-config", bad)
    assert status == FAILED
    assert "nowhere" in output


def test_usage_errors_and_unreadable_files_are_status_2(tmp_path: Path) -> None:
    assert invoke("check-config", str(tmp_path / "missing.yaml"))[0] == INVALID
    assert invoke("check-config", str(tmp_path))[0] == INVALID  # a directory
    assert invoke("check-config")[0] == INVALID
    assert invoke("no-such-command")[0] == INVALID
    assert invoke("check-config", "--no-such-option", "x.yaml")[0] == INVALID


def test_invalid_scenarios_are_invalid_input(tmp_path: Path) -> None:
    bad = write(tmp_path, "name: x\nphases: 3\n", "scenario.yaml")
    assert invoke("simulate", bad)[0] == INVALID
    assert invoke("simulate", str(tmp_path / "missing.yaml"))[0] == INVALID
    assert invoke("drill", str(tmp_path / "missing.yaml"))[0] == INVALID


def test_shape_detection() -> None:
    assert {"listen", "upstreams", "routes", "admin"} <= gateway_sections()
    assert not {"resources", "defaults", "stores"} & gateway_sections()
    assert is_gateway_document({"routes": []})
    assert not is_gateway_document({"resources": {"a": {}}, "defaults": {}})


def test_gateway_on_a_library_file_says_it_is_not_a_gateway_configuration() -> None:
    status, output = invoke("gateway", "-c", str(EXAMPLES / "floodwall.yaml"))
    assert status == INVALID
    flat = output
    assert "this is not a gateway configuration" in flat
    assert "admin token" not in flat
    assert "floodwall check-config" in flat


def test_python_m_floodwall_gateway_has_version_and_the_same_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from floodwall.gateway.__main__ import main

    version = subprocess.run(
        [sys.executable, "-m", "floodwall.gateway", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert (version.returncode, version.stdout) == (0, f"floodwall {floodwall.__version__}\n")
    with pytest.raises(SystemExit) as usage:
        main([])  # -c is required
    assert usage.value.code == INVALID
    assert main(["-c", str(EXAMPLES / "floodwall.yaml")]) == INVALID
    assert "this is not a gateway configuration" in capsys.readouterr().err
    assert main(["-c", str(tmp_path / "missing.yaml")]) == INVALID
    assert "cannot read the file" in capsys.readouterr().err
