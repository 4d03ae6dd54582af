"""https upstreams through a real gateway: a throwaway CA and certificates made with
``cryptography``, aiohttp upstreams serving TLS on loopback, and the gateway's ``tls`` section
(private CA, name override, client certificates), its validation and its reload rule."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import GatewayThread
from floodwall import ConfigError
from floodwall.gateway.config import parse_gateway
from webservers import LoopThread, bound_socket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Start = Callable[[dict[str, Any]], GatewayThread]
LOOPBACK = ("127.0.0.1", "localhost")

# -- a throwaway PKI --------------------------------------------------------------------------


@dataclass(frozen=True)
class Pem:
    """A certificate and its key, written as PEM files."""

    cert: Path
    key: Path


class Authority:
    """A self-signed CA in ``directory`` that issues leaf certificates (EC P-256, one day)."""

    def __init__(self, directory: Path, name: str = "floodwall test CA") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.name = subject
        self.cert = (
            _builder(subject, subject, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.file = directory / f"{name.replace(' ', '-')}.pem"
        self.file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, names: tuple[str, ...] = LOOPBACK, *, client: bool = False) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, stem)])
        alt: list[x509.GeneralName] = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = _builder(subject, self.name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        pem = Pem(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        pem.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return pem


def _builder(subject: x509.Name, issuer: x509.Name, key: Any) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path)


# -- an https upstream ------------------------------------------------------------------------


@dataclass
class Seen:
    """What an https upstream saw: one entry per request, and its health answers."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    healthy: bool = True
    health_checks: int = 0

    @property
    def connections(self) -> int:
        """Distinct client connections (each one a TLS handshake)."""
        return len({r["peer"] for r in self.requests})


class HttpsUpstream:
    """An aiohttp upstream serving TLS with ``pem`` on 127.0.0.1 (a client certificate
    signed by ``client_ca`` required when given)."""

    def __init__(self, pem: Pem, client_ca: Path | None = None) -> None:
        self.seen = Seen()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(pem.cert, pem.key)
        if client_ca is not None:
            self.context.load_verify_locations(cafile=client_ca)
            self.context.verify_mode = ssl.CERT_REQUIRED
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop = LoopThread()
        self.port = 0

    async def _health(self, request: web.Request) -> web.Response:
        self.seen.health_checks += 1
        return web.Response(status=200 if self.seen.healthy else 503, text="health")

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.read()
        transport = request.transport
        assert transport is not None
        peer_cert = transport.get_extra_info("peercert") or {}
        self.seen.requests.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "length": len(body),
                "chunked": request.headers.get("Transfer-Encoding") == "chunked",
                "peer": transport.get_extra_info("peername"),
                "client": dict(item[0] for item in peer_cert.get("subject", ())),
            }
        )
        return web.json_response({"path": request.path_qs, "length": len(body)})

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> HttpsUpstream:
        async def up() -> None:
            await self._runner.setup()
            sock = bound_socket()
            self.port = sock.getsockname()[1]
            await web.SockSite(self._runner, sock, ssl_context=self.context).start()

        self._loop.run(up())
        return self

    def stop(self) -> None:
        self._loop.run(self._runner.cleanup())
        self._loop.close()


@pytest.fixture
def https_upstreams() -> Iterator[Callable[..., HttpsUpstream]]:
    """``https_upstreams(pem, client_ca=None)``: a started :class:`HttpsUpstream`."""
    started: list[HttpsUpstream] = []

    def start(pem: Pem, client_ca: Path | None = None) -> HttpsUpstream:
        upstream = HttpsUpstream(pem, client_ca).start()
        started.append(upstream)
        return upstream

    try:
        yield start
    finally:
        for upstream in started:
            upstream.stop()


def config(upstream: HttpsUpstream, tls: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    """One route to one upstream (``extra`` added to the upstream's section)."""
    section: dict[str, Any] = {"endpoints": [upstream.url], **extra}
    if tls is not None:
        section["tls"] = tls
    return {
        "upstreams": {"billing": section},
        "resources": {"billing": {"timeout": "2s", "retry": False}},
        "routes": [{"match": {"path_prefix": "/"}, "upstream": "billing", "resource": "billing"}],
    }


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def endpoint_status(gw: GatewayThread) -> dict[str, Any]:
    status: dict[str, Any] = gw.admin("GET", "/status").json()
    endpoint: dict[str, Any] = status["upstreams"]["billing"]["endpoints"][0]
    return endpoint


# -- through the gateway ----------------------------------------------------------------------


def test_get_and_streamed_post_over_a_private_ca_on_one_connection(
    ca: Authority, https_upstreams: Callable[..., HttpsUpstream], gateways: Start
) -> None:
    upstream = https_upstreams(ca.issue("billing"))
    gw = gateways(config(upstream, {"ca_file": str(ca.file)}))
    payload = b"x" * 200_000  # above retry_body_limit: streamed, never buffered

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(payload), 16_384):
            yield payload[start : start + 16_384]

    with httpx.Client(base_url=gw.url, timeout=5) as client:
        for i in range(5):
            answer = client.get(f"/invoices/{i}")
            assert answer.status_code == 200
            assert answer.json() == {"path": f"/invoices/{i}", "length": 0}
        posted = client.post("/upload", content=chunks())
        assert posted.status_code == 200 and posted.json()["length"] == len(payload)
        assert client.get("/after").status_code == 200
    assert upstream.seen.requests[5]["chunked"]  # the body really was streamed upstream
    assert upstream.seen.connections == 1  # one TLS handshake for seven requests
    assert gw.gateway.pools()["billing"].client.connects == 1


def test_server_name_overrides_the_name_checked(
    ca: Authority, https_upstreams: Callable[..., HttpsUpstream], gateways: Start
) -> None:
    upstream = https_upstreams(ca.issue("billing", ("billing.internal",)))
    tls = {"ca_file": str(ca.file), "server_name": "billing.internal"}
    gw = gateways(config(upstream, tls))
    assert httpx.get(gw.url + "/by-name", timeout=5).status_code == 200


@pytest.mark.parametrize("case", ["system trust store", "wrong server_name", "another CA"], ids=str)
def test_an_untrusted_upstream_fails_fast_with_a_502_the_breaker_counts(
    case: str,
    ca: Authority,
    tmp_path: Path,
    https_upstreams: Callable[..., HttpsUpstream],
    gateways: Start,
) -> None:
    upstream = https_upstreams(ca.issue("billing"))
    tls: dict[str, Any] | None = {
        "system trust store": None,
        "wrong server_name": {"ca_file": str(ca.file), "server_name": "other.internal"},
        "another CA": {"ca_file": str(Authority(tmp_path / "other", "other CA").file)},
    }[case]
    settings = config(upstream, tls)
    settings["resources"]["billing"]["circuit_breaker"] = {
        "minimum_calls": 3,
        "failure_rate": 0.5,
        "window": "10s",
        "open_duration": "30s",
    }
    gw = gateways(settings)
    with httpx.Client(base_url=gw.url, timeout=5) as client:
        started = time.monotonic()
        failed = [client.get("/invoices") for _ in range(3)]
        assert time.monotonic() - started < 2.0  # refused at the handshake, never a hang
        for answer in failed:
            assert answer.status_code == 502
            problem = answer.json()
            assert problem["kind"] == "upstream_unavailable"
            assert problem["detail"].startswith(
                "upstream 'billing': UpstreamConnectError: "
                "TLS: the upstream's certificate is not trusted ("
            )
        opened = client.get("/invoices")  # three failures of three: the breaker opened
        assert opened.status_code == 503
    assert upstream.seen.requests == []
    assert endpoint_status(gw)["failures"] == 3
    breaker = gw.admin("GET", "/status").json()["routes"]["/"]["breaker"]
    assert breaker["state"] == "OPEN"


def test_health_checks_run_over_tls(
    ca: Authority, https_upstreams: Callable[..., HttpsUpstream], gateways: Start
) -> None:
    upstream = https_upstreams(ca.issue("billing"))
    upstream.seen.healthy = False
    check = {"interval": "50ms", "timeout": "1s", "healthy_threshold": 1, "unhealthy_threshold": 1}
    gw = gateways(config(upstream, {"ca_file": str(ca.file)}, health_check=check))
    wait_for(lambda: not endpoint_status(gw)["healthy"])
    assert httpx.get(gw.url + "/invoices", timeout=5).status_code == 503
    upstream.seen.healthy = True
    wait_for(lambda: endpoint_status(gw)["healthy"])
    assert httpx.get(gw.url + "/invoices", timeout=5).status_code == 200
    assert upstream.seen.health_checks >= 2
    probes = gw.gateway.pools()["billing"].client.connects
    assert probes <= 2  # probes and requests share the pool's kept-alive connections


def test_mutual_tls_presents_the_gateways_certificate(
    ca: Authority, https_upstreams: Callable[..., HttpsUpstream], gateways: Start
) -> None:
    upstream = https_upstreams(ca.issue("billing"), client_ca=ca.file)
    client = ca.issue("gateway", (), client=True)
    tls = {"ca_file": str(ca.file), "cert_file": str(client.cert), "key_file": str(client.key)}
    gw = gateways(config(upstream, tls))
    assert httpx.get(gw.url + "/mtls", timeout=5).status_code == 200
    assert upstream.seen.requests[0]["client"] == {"commonName": "gateway"}

    anonymous = gateways(config(upstream, {"ca_file": str(ca.file)}))
    refused = httpx.get(anonymous.url + "/mtls", timeout=5)
    # TLS 1.3: the upstream refuses a missing client certificate after the client's side of
    # the handshake is done, so the gateway sees the connection close unanswered.
    assert refused.status_code == 502
    assert endpoint_status(anonymous)["failures"] == 1
    assert len(upstream.seen.requests) == 1


# -- configuration ----------------------------------------------------------------------------


def parse(tls: Any, endpoint: str = "https://127.0.0.1:8443") -> Any:
    raw = {"upstreams": {"billing": {"endpoints": [endpoint], "tls": tls}}}
    return parse_gateway(raw, "gw.yaml").upstreams["billing"]


@pytest.mark.parametrize(
    ("tls", "endpoint", "message"),
    [
        (
            {"ca_file": "/nonexistent/ca.pem"},
            "https://127.0.0.1:8443",
            "gw.yaml: upstreams.billing.tls.ca_file: no such file '/nonexistent/ca.pem'\n",
        ),
        (
            {"ca_file": "CA"},
            "http://127.0.0.1:8080",
            "gw.yaml: upstreams.billing: tls: applies to https:// endpoints, and this upstream "
            "has none (endpoints: http://127.0.0.1:8080)",
        ),
        ({"key_file": "KEY"}, "https://h:1", "upstreams.billing.tls: key_file '"),
        ({"ca_file": "CA", "verify": False}, "https://h:1", "ca_file has no effect with verify"),
        ({"ca_file": "KEY"}, "https://h:1", "upstreams.billing.tls: ca_file '"),
        ({"cert_file": "CA", "key_file": "KEY"}, "https://h:1", "not a certificate and its"),
        ({"verify": "maybe"}, "https://h:1", "upstreams.billing.tls.verify:"),
        ({"sni": "x"}, "https://h:1", "upstreams.billing.tls.sni: Extra inputs"),
    ],
)
def test_tls_settings_are_checked_on_load(
    ca: Authority, tls: dict[str, Any], endpoint: str, message: str
) -> None:
    leaf = ca.issue("leaf")
    files = {"CA": str(ca.file), "KEY": str(leaf.key)}
    tls = {k: files.get(v, v) if isinstance(v, str) else v for k, v in tls.items()}
    with pytest.raises(ConfigError) as error:
        parse(tls, endpoint)
    assert message in str(error.value) + "\n"


def test_verify_false_and_mixed_endpoints_are_allowed(ca: Authority) -> None:
    insecure = parse({"verify": False})
    assert insecure.tls.context.verify_mode == ssl.CERT_NONE
    raw = {"endpoints": ["http://127.0.0.1:1", "https://127.0.0.1:2"], "tls": {"verify": True}}
    assert parse_gateway({"upstreams": {"b": raw}}).upstreams["b"].tls is not None


def test_a_reload_keeps_the_context_of_unchanged_files_and_rebuilds_rotated_ones(
    ca: Authority,
) -> None:
    section = {"ca_file": str(ca.file)}
    first, again = parse(section), parse(section)
    assert first == again  # same files, same bytes: the running pool is kept
    assert first.tls.context is not again.tls.context
    ca.file.write_bytes(Authority(ca.directory / "rotated", "rotated CA").file.read_bytes())
    assert parse(section) != first  # rotated: a new pool with a new context


def test_a_gateway_reload_rebuilds_the_pool_when_the_ca_file_changes(
    ca: Authority, https_upstreams: Callable[..., HttpsUpstream], gateways: Start
) -> None:
    upstream = https_upstreams(ca.issue("billing"))
    settings = config(upstream, {"ca_file": str(ca.file)})
    gw = gateways(settings)
    assert httpx.get(gw.url + "/a", timeout=5).status_code == 200
    pool = gw.gateway.pools()["billing"]
    assert gw.admin("POST", "/reload?source=gw.json", content=gw.text).status_code == 200
    assert gw.gateway.pools()["billing"] is pool  # nothing changed: connections kept
    ca.file.write_bytes(Authority(ca.directory / "rotated", "rotated CA").file.read_bytes())
    assert gw.admin("POST", "/reload?source=gw.json", content=gw.text).status_code == 200
    assert gw.gateway.pools()["billing"] is not pool
    assert httpx.get(gw.url + "/b", timeout=5).status_code == 502  # the old CA is gone
