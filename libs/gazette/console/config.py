"""The console's settings (`ConsoleConfig`) and its command line's options
(`CONSOLE_OPTIONS`: flag, environment variable, default, help), and how they become the
clients' addresses and auth: as gazctl finds them (`gazette.gazctl.config`,
`gazette.gazctl.__main__.client_auth`), so one ``export`` line serves both."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gazette.auth import ClientAuth, TLSFiles
from gazette.auth.tokens import Claims, Unauthenticated, unverified_claims
from gazette.errors import ValidationError
from gazette.gazctl.__main__ import client_auth, scheme_checked
from gazette.gazctl.config import Address, UsageError, broker_address, consumer_address
from gazette.keyspace import BROKER_ROOT, CONSUMER_ROOT
from gazette.serving.options import ETCD_TLS_OPTIONS, Option, with_defaults

#: The default port of the console's pages.
DEFAULT_PORT = 8088
#: Messages a browser page shows by default, and at most.
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 100, 1000


@dataclass(kw_only=True)
class ConsoleConfig:
    """Where the console listens, what it talks to, and with which token and TLS.
    Empty addresses are found as gazctl finds them ($BROKER_ADDRESS, gazctl.ini, the
    default); an empty etcd address leaves the members page without members."""

    port: int = DEFAULT_PORT
    bind: str = "127.0.0.1"
    broker_address: str = ""
    consumer_address: str = ""
    etcd_address: str = ""
    etcd_prefix: str = BROKER_ROOT
    consumer_etcd_prefix: str = CONSUMER_ROOT
    #: Client TLS toward brokers and consumer members (as gazctl's flags).
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: The one bearer token the console presents; what it grants decides which write
    #: actions the pages offer (none without one).
    auth_token: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_ca_file: str = ""
    #: Seconds a page may take in all (each call to a broker, member or etcd is within).
    timeout: float = 10.0
    #: The environment gazctl's fallbacks read ($BROKER_ADDRESS, gazctl.ini's $HOME).
    env: Mapping[str, str] = field(default_factory=dict, repr=False)


def _checked(what: str, found: Address, auth: ClientAuth) -> Address:
    try:
        scheme_checked(auth, found, what)
    except UsageError as err:
        raise ValidationError(f"{what}.address", str(err)) from None
    return found


@dataclass(frozen=True)
class Resolved:
    """A config's addresses and auth, checked: a `ValidationError` names the flag."""

    broker: Address
    consumer: Address
    auth: ClientAuth
    etcd_tls: TLSFiles | None
    #: What the token says it grants (None: no token, or one the console cannot read).
    grant: Claims | None
    #: Why the token's grant is unknown ("" when it is known or there is no token).
    grant_problem: str

    @classmethod
    def of(cls, config: ConsoleConfig) -> Resolved:
        if not config.timeout > 0:
            raise ValidationError("console.timeout", f"must be > 0 seconds, got "
                                  f"{config.timeout!r}")
        try:
            auth = client_auth(config, {})
            broker = broker_address(config.broker_address or None, config.env)
            consumer = consumer_address(config.consumer_address or None, config.env)
        except UsageError as err:
            raise ValidationError("address", str(err)) from None
        auth = auth or ClientAuth()
        _checked("broker", broker, auth)
        _checked("consumer", consumer, auth)
        etcd = TLSFiles(config.etcd_cert_file, config.etcd_key_file, config.etcd_ca_file)
        grant, problem = None, ""
        if config.auth_token:
            try:
                grant = unverified_claims(config.auth_token)
            except Unauthenticated as err:
                problem = f"the console's token cannot be read ({err.reason})"
        return cls(broker, consumer, auth,
                   etcd if etcd.cert_file or etcd.ca_file else None, grant, problem)


#: The options of ``gazette console``; each sets the `ConsoleConfig` field it names.
CONSOLE_OPTIONS: tuple[Option, ...] = with_defaults(ConsoleConfig, [
    Option("--console.port", "CONSOLE_PORT", "port", int,
           "port of the console's pages (0: any free port)"),
    Option("--console.bind", "CONSOLE_BIND", "bind", str,
           "interface to listen on (0.0.0.0: every one)"),
    Option("--console.timeout", "CONSOLE_TIMEOUT", "timeout", float,
           "seconds a page may take, every call to a broker, member or etcd within"),
    Option("--broker.address", "BROKER_ADDRESS", "broker_address", str,
           "a broker of the cluster (https:// for TLS)",
           shown_default="gazctl.ini, else localhost:8080"),
    Option("--consumer.address", "CONSUMER_ADDRESS", "consumer_address", str,
           "a member of the consumer application the shards page shows",
           shown_default="gazctl.ini, else localhost:8090"),
    Option("--etcd.address", "ETCD_ADDRESS", "etcd_address", str,
           "etcd endpoint, for the members page and other applications' shards "
           "(none: those pages say so)"),
    Option("--etcd.prefix", "ETCD_PREFIX", "etcd_prefix", str,
           "etcd prefix of the broker cluster"),
    Option("--consumer.etcd-prefix", "CONSUMER_ETCD_PREFIX", "consumer_etcd_prefix", str,
           "etcd prefix of consumer applications"),
    Option("--tls.ca-file", "TLS_CA_FILE", "tls_ca_file", str,
           "PEM CA bundle verifying brokers and members (TLS on)"),
    Option("--tls.cert-file", "TLS_CERT_FILE", "tls_cert_file", str,
           "PEM client certificate toward brokers and members (mutual TLS)"),
    Option("--tls.key-file", "TLS_KEY_FILE", "tls_key_file", str,
           "PEM private key of --tls.cert-file"),
    Option("--auth.token", "AUTH_TOKEN", "auth_token", str,
           "the bearer token of every call; its capabilities decide which write actions "
           "(replay) the pages offer: none without a token"),
    *ETCD_TLS_OPTIONS,
])
