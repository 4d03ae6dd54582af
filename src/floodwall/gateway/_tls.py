"""Client TLS for https upstreams: one :class:`ssl.SSLContext` per upstream, built from files.

A context is built when the configuration is read (so a bad bundle or a key that does not match
its certificate fails the load or the reload, naming the file), and it compares equal to another
built from the same settings and the same bytes: a reload that leaves an upstream and its files
unchanged keeps that upstream's pool (its connections and its health state); a reload after the
files changed (certificates rotated) builds a new pool with a new context.
"""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path

__all__ = ["ClientTls", "build_client_tls"]


class ClientTls:
    """A built client context and the digest of what it was built from."""

    __slots__ = ("context", "digest")

    def __init__(self, context: ssl.SSLContext, digest: bytes) -> None:
        self.context = context
        self.digest = digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientTls) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"ClientTls({self.digest.hex()[:12]})"


def _no_password() -> bytes:
    """Answer OpenSSL's passphrase prompt: a gateway must never wait on a terminal."""
    return b""


def build_client_tls(
    *,
    ca_file: Path | None,
    verify: bool,
    cert_file: Path | None,
    key_file: Path | None,
) -> ClientTls:
    """A client context: the system's trust store, or only ``ca_file``'s certificates;
    hostname and chain checks unless ``verify`` is false (unsafe); ``cert_file`` (with
    ``key_file``, or a key in the same file) presented to upstreams that ask for one (mTLS).

    Raises ``ValueError`` naming the setting and the file when one cannot be used.
    """
    digest = hashlib.sha256(repr((verify, ca_file, cert_file, key_file)).encode())
    files = {"ca_file": ca_file, "cert_file": cert_file, "key_file": key_file}
    for key, path in files.items():
        if path is None:
            continue
        try:
            digest.update(path.read_bytes())
        except OSError as exc:
            raise ValueError(f"{key} {str(path)!r} cannot be read: {exc.strerror}") from None
    try:  # with a cafile, only its certificates are trusted (not the system's)
        context = ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError as exc:
        raise ValueError(f"ca_file {str(ca_file)!r} holds no usable certificate ({exc})") from None
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        try:
            context.load_cert_chain(cert_file, key_file, password=_no_password)
        except ssl.SSLError as exc:
            raise ValueError(
                f"cert_file {str(cert_file)!r} with key_file {str(key_file or cert_file)!r}: "
                f"not a certificate and its unencrypted private key ({exc})"
            ) from None
    return ClientTls(context, digest.digest())
