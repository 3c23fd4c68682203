"""A serving member's security, from its flags: TLS of its listeners and of its calls to
others and to etcd, its signing keys, the authorizer and interceptors of its gRPC
server, and its own token. Brokers and consumer members build one each
(`MemberSecurity`) from the fields of `SecurityConfig`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from gazette.auth.channels import ClientAuth
from gazette.auth.server import Authorizer, current_caller, server_interceptors
from gazette.auth.tls import TLSFiles
from gazette.auth.tokens import Capability, ServiceToken, SigningKeys
from gazette.errors import ValidationError


@dataclass(kw_only=True)
class SecurityConfig:
    """The security fields of a member's config (flags:
    `gazette.serving.options.SECURITY_OPTIONS`). All empty: plain text and no
    authorization, as a local cluster runs."""

    #: PEM certificate chain and key of the gRPC and HTTP listeners (TLS on when set),
    #: also presented to other members and servers that ask for a client certificate.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: CA bundle verifying servers this member calls (and clients, with mTLS).
    tls_ca_file: str = ""
    #: Require client certificates (mutual TLS).
    tls_client_auth: bool = False
    #: Signing keys (base64, whitespace- or comma-separated): authorization on.
    auth_keys_file: str = ""
    #: Token of this member's own calls when it has no keys (a consumer).
    auth_token: str = ""
    #: etcd's client TLS (with an https:// etcd address).
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_ca_file: str = ""
    #: Log one line per gRPC call (logger ``gazette.access``).
    log_access: bool = False


class MemberSecurity:
    """What `SecurityConfig` asks for, checked (a missing file is a `ValidationError`
    naming its flag): `tls` (None: plain text), `keys`, `etcd_tls`, the `authorizer` of
    `capabilities` (unlisted methods need `default`), and this member's own token
    (`subject`, `own_capabilities`)."""

    def __init__(self, cfg: SecurityConfig, subject: str,
                 own_capabilities: frozenset[Capability],
                 capabilities: Mapping[str, Capability | None],
                 default: Capability | None = None) -> None:
        self.config = cfg
        tls = TLSFiles(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_ca_file,
                       cfg.tls_client_auth)
        if cfg.tls_ca_file and not tls.serves:
            raise ValidationError("tls.cert-file", "--tls.ca-file is set but this member "
                                  "has no certificate: set --tls.cert-file and "
                                  "--tls.key-file (TLS is all or nothing)")
        self.tls = tls if tls.serves else None
        etcd = TLSFiles(cfg.etcd_cert_file, cfg.etcd_key_file, cfg.etcd_ca_file)
        self.etcd_tls = etcd if etcd.cert_file or etcd.ca_file else None
        self.keys = SigningKeys.from_file(cfg.auth_keys_file) if cfg.auth_keys_file else None
        self.authorizer = Authorizer(self.keys, capabilities, default)
        self.token = ServiceToken(self.keys, subject, own_capabilities) \
            if self.keys is not None else None
        if cfg.auth_token and self.token is not None:
            raise ValidationError("auth.token", "set --auth.keys-file or --auth.token, "
                                  "not both (a member with keys issues its own token)")

    @property
    def scheme(self) -> str:
        """The scheme of this member's advertised URLs."""
        return "https" if self.tls is not None else "http"

    def server_credentials(self) -> grpc.ServerCredentials | None:
        return self.tls.server_credentials() if self.tls is not None else None

    def interceptors(self) -> list[Any]:
        return server_interceptors(self.authorizer, self.config.log_access)

    def http_context(self) -> Any:
        """The `ssl.SSLContext` of the HTTP listener (None: plain HTTP)."""
        return self.tls.server_context() if self.tls is not None else None

    def own_token(self) -> str:
        return self.token.current() if self.token is not None else self.config.auth_token

    def client_auth(self) -> ClientAuth:
        """How this member calls others on its own behalf."""
        return ClientAuth(self.tls, token_source=self.own_token)

    def caller_auth(self) -> ClientAuth:
        """How this member calls its own gRPC service for a caller it serves (the HTTP
        gateway): with that caller's token."""
        source: Callable[[], str] = lambda: current_caller().token  # noqa: E731
        return ClientAuth(self.tls, token_source=source)
