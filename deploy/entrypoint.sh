#!/bin/sh
# Entry point of the floodwall gateway image (deploy/Dockerfile).
#
#   floodwall-entrypoint [GATEWAY OPTIONS]  render and check the configuration, then exec the gateway
#                                           (options such as --workers 4 are passed on)
#   floodwall-entrypoint --check            render and check the configuration, print a summary, exit
#   floodwall-entrypoint --healthcheck      GET the admin listener's /healthz (the image's HEALTHCHECK)
#   floodwall-entrypoint COMMAND [ARGS]     run another command instead (a shell, to debug)
#
# The configuration (FLOODWALL_CONFIG, default /etc/floodwall/gateway.yaml, e.g. a mounted
# Kubernetes ConfigMap) may name environment variables as ${NAME} or ${NAME:-default}, so that
# secrets and addresses (a Redis URL with its password) stay out of the file. They are
# substituted into FLOODWALL_RUNTIME_DIR/gateway.yaml (mode 0600) before the gateway reads it;
# a variable that is neither set nor defaulted is an error, as is an invalid file or a missing
# or short admin token. Exit status 2 for a bad configuration, 1 for anything else.
set -eu

CONFIG="${FLOODWALL_CONFIG:-/etc/floodwall/gateway.yaml}"
RUNTIME_DIR="${FLOODWALL_RUNTIME_DIR:-/tmp/floodwall}"
PYTHON="${FLOODWALL_PYTHON:-python}"
HEALTH_URL="${FLOODWALL_HEALTH_URL:-http://127.0.0.1:9901/healthz}"
RENDERED="$RUNTIME_DIR/gateway.yaml"

log() {
    printf 'floodwall-entrypoint: %s\n' "$*" >&2
}

render_and_check() {
    mkdir -p "$RUNTIME_DIR"
    chmod 0700 "$RUNTIME_DIR"
    "$PYTHON" - "$CONFIG" "$RENDERED" <<'PY'
import os
import re
import sys
from pathlib import Path

source, target = sys.argv[1], sys.argv[2]
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def fail(message: str, status: int = 2) -> None:
    print(f"floodwall-entrypoint: {message}", file=sys.stderr)
    raise SystemExit(status)


try:
    text = Path(source).read_text(encoding="utf-8")
except OSError as exc:
    fail(f"cannot read the configuration {source}: {exc.strerror} "
         "(mount it there, or set FLOODWALL_CONFIG)")
missing = sorted({m[1] for m in PLACEHOLDER.finditer(text)
                  if m[1] not in os.environ and m[2] is None})
if missing:
    fail(f"{source} names environment variables that are not set: {', '.join(missing)}")
rendered = PLACEHOLDER.sub(lambda m: os.environ.get(m[1], m[2] or ""), text)

from floodwall._core.errors import ConfigError  # noqa: E402 - after the cheap checks
from floodwall.gateway.config import parse_gateway_text  # noqa: E402

try:
    document = parse_gateway_text(rendered, source)
except ConfigError as exc:
    fail(f"invalid configuration:\n{exc}")
admin = document.admin
if admin is not None and len(os.environ.get(admin.token_env, "")) < 16:
    fail(f"{source}: admin.token_env: set {admin.token_env} to a random token of at least "
         "16 characters (the admin listener refuses to start without one)")
fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w", encoding="utf-8") as out:
    out.write(rendered)
host, port = document.listen
where = "off" if admin is None else f"{admin.listen[0]}:{admin.listen[1]}"
print(f"floodwall-entrypoint: {source} is valid: {len(document.routes)} route(s), "
      f"{len(document.upstreams)} upstream(s), {len(document.resources)} resource(s); "
      f"listen {host}:{port}, admin {where}", file=sys.stderr)
PY
}

case "${1:-}" in
    --healthcheck)
        exec "$PYTHON" -c 'import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2).read()
except Exception as exc:
    sys.exit(f"unhealthy: {exc}")' "$HEALTH_URL"
        ;;
    --check)
        render_and_check
        exit 0
        ;;
    "" | -*)
        render_and_check
        exec "$PYTHON" -m floodwall.gateway --config "$RENDERED" "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
