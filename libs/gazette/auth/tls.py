"""TLS from PEM files, re-read when they change (a cert-manager rotation needs no
restart).

`TLSFiles` names a process's certificate chain and key (its listeners', and its client
certificate toward others), the CA bundle that verifies the other side, and whether
listeners require client certificates (mutual TLS). Servers check the files at every
new connection (a `stat` of each; gRPC's certificate fetcher, the HTTP listener's
handshake callback) and take new contents for the connections that follow; clients read
them when they open a channel (`channel_credentials`; `Channels` opens new ones once
the files change).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gazette.auth.expiry import watch_expiry
from gazette.errors import ValidationError

log = logging.getLogger(__name__)

#: (inode, size, mtime_ns) of each file: what says a file changed.
Signature = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """PEM files of a process's TLS. A client needs only `ca_file` (plus its own
    `cert_file`/`key_file` for a server that requires client certificates); a server
    needs `cert_file` and `key_file`, and `ca_file` with `client_auth`."""

    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    client_auth: bool = False

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValidationError("tls.cert-file" if not self.cert_file else "tls.key-file",
                                  "a certificate and its key go together: set both")
        if self.client_auth and not self.ca_file:
            raise ValidationError("tls.ca-file", "client authentication (mTLS) verifies "
                                  "client certificates with a CA: set --tls.ca-file")
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ValidationError(f"tls.{name.replace('_', '-')}",
                                      f"{path} is not a readable file")

    @classmethod
    def system(cls) -> TLSFiles:
        """A client's TLS toward servers the system trusts: the system's CA bundle
        (``$SSL_CERT_FILE``, else OpenSSL's default file), else gRPC's own roots."""
        found = ssl.get_default_verify_paths().cafile
        return cls(ca_file=found or "")

    @property
    def serves(self) -> bool:
        """Whether listeners can serve TLS (a certificate and its key are set)."""
        return bool(self.cert_file)

    def signature(self) -> Signature:
        out = []
        for path in (self.cert_file, self.key_file, self.ca_file):
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None  # mid-rotation (a symlink swapped): keep what we have
            out.append((st.st_ino, st.st_size, st.st_mtime_ns) if st else (0, 0, 0))
        return tuple(out)

    def _read(self, path: str) -> bytes | None:
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ValidationError("tls", f"cannot read {path}: {exc.strerror or exc}"
                                  ) from None

    # -- gRPC ----------------------------------------------------------------------

    def server_credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that follow the files: checked at each new
        connection, re-read when their signature changes."""
        watch_expiry(self.cert_file)
        reloader = _GrpcReloader(self)
        return grpc.dynamic_ssl_server_credentials(
            reloader.initial, reloader.fetch,
            require_client_authentication=self.client_auth)

    def _server_config(self) -> Any:
        key, cert = self._read(self.key_file), self._read(self.cert_file)
        assert key is not None and cert is not None
        return grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=self._read(self.ca_file))

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC client credentials from the files as they are now."""
        return grpc.ssl_channel_credentials(
            root_certificates=self._read(self.ca_file),
            private_key=self._read(self.key_file),
            certificate_chain=self._read(self.cert_file))

    # -- HTTP ----------------------------------------------------------------------

    def client_context(self) -> ssl.SSLContext:
        """An `ssl.SSLContext` for an HTTPS client: trusting the CA file (else the
        system's CAs), presenting the certificate if there is one."""
        ctx = ssl.create_default_context(cafile=self.ca_file or None)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file or None)
        return ctx

    def server_context(self) -> ssl.SSLContext:
        """An `ssl.SSLContext` for an HTTP listener that follows the files: each
        handshake checks them and, once changed, is served with a new context."""
        watch_expiry(self.cert_file)
        return _HttpReloader(self).context


class _GrpcReloader:
    """gRPC's certificate fetcher: called by gRPC at each new connection."""

    def __init__(self, files: TLSFiles) -> None:
        self.files = files
        self._signature = files.signature()
        self.initial = files._server_config()
        self._lock = threading.Lock()  # gRPC may call from its own threads

    def fetch(self) -> Any:
        signature = self.files.signature()
        with self._lock:
            if signature == self._signature:
                return None
            try:
                config = self.files._server_config()
            except (ValidationError, ValueError) as err:
                log.error("TLS files changed but cannot be loaded (still serving the "
                          "previous certificate): %s", err)
                return None
            self._signature = signature
        log.info("TLS certificate reloaded from %s", self.files.cert_file)
        return config


class _HttpReloader:
    """An HTTP listener's context; its SNI callback (called at every handshake, with
    or without a server name) swaps in a context made from the changed files."""

    def __init__(self, files: TLSFiles) -> None:
        self.files = files
        self._signature = files.signature()
        self._current = self._make()
        self.context = self._current
        self.context.sni_callback = self._handshake

    def _make(self) -> ssl.SSLContext:
        files = self.files
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(files.cert_file, files.key_file)
            if files.ca_file:
                ctx.load_verify_locations(files.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValidationError("tls", f"cannot load {files.cert_file} / "
                                  f"{files.key_file}: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if files.client_auth else ssl.CERT_NONE
        return ctx

    def _handshake(self, sslobj: Any, server_name: str | None, ctx: ssl.SSLContext
                   ) -> None:
        signature = self.files.signature()
        if signature != self._signature:
            try:
                fresh = self._make()
            except ValidationError as err:
                log.error("TLS files changed but cannot be loaded (still serving the "
                          "previous certificate): %s", err)
            else:
                self._signature, self._current = signature, fresh
                log.info("TLS certificate reloaded from %s", self.files.cert_file)
        if self._current is not ctx:
            sslobj.context = self._current
