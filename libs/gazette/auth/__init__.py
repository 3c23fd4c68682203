"""Security: TLS from files that may rotate, bearer tokens with capabilities and a label
selector, and the gRPC interceptors that enforce them on brokers and consumer members.

- `tokens`: `Capability`, `Claims`, `SigningKeys` (issue, verify), `ServiceToken`;
- `tls`: `TLSFiles` (server credentials and HTTP contexts that reload, client
  credentials);
- `channels`: `ClientAuth` and `open_channel`, how clients present TLS and tokens
  (`auth_for`: as an address's scheme asks);
- `server`: `Authorizer`, `AuthInterceptor`, `ObserveInterceptor`, `current_caller`,
  `require_scope`;
- `member`: `SecurityConfig` (a member's flags) and `MemberSecurity` (what they make).
"""

from gazette.auth.channels import (
    AUTHORIZATION,
    PLAIN,
    ClientAuth,
    auth_for,
    bearer,
    open_channel,
)
from gazette.auth.member import MemberSecurity, SecurityConfig
from gazette.auth.server import (
    ANONYMOUS,
    NOBODY,
    AuthInterceptor,
    Authorizer,
    Caller,
    ObserveInterceptor,
    abort_refused,
    count_refusal,
    current_caller,
    drain_refused,
    require_scope,
    server_interceptors,
    set_caller,
    status_of,
)
from gazette.auth.tls import TLSFiles
from gazette.auth.tokens import (
    UNRESTRICTED,
    AuthError,
    Capability,
    Claims,
    PermissionDenied,
    ServiceToken,
    SigningKeys,
    Unauthenticated,
    parse_capabilities,
)

__all__ = [
    "ANONYMOUS",
    "AUTHORIZATION",
    "NOBODY",
    "PLAIN",
    "UNRESTRICTED",
    "AuthError",
    "AuthInterceptor",
    "Authorizer",
    "Caller",
    "Capability",
    "Claims",
    "ClientAuth",
    "MemberSecurity",
    "ObserveInterceptor",
    "PermissionDenied",
    "SecurityConfig",
    "ServiceToken",
    "SigningKeys",
    "TLSFiles",
    "Unauthenticated",
    "abort_refused",
    "auth_for",
    "bearer",
    "count_refusal",
    "current_caller",
    "drain_refused",
    "open_channel",
    "parse_capabilities",
    "require_scope",
    "server_interceptors",
    "set_caller",
    "status_of",
]
