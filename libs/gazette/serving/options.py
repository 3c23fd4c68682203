"""A serving process's options, each described once (`Option`: flag, environment variable,
config field, type, default, help), from which its command line (`add_options`: every
flag falling back to its environment variable, then its default), its config
(`config_values`) and the docs' tables of its flags (`markdown_table`) are made.

The options every member shares are made here (`identity_options`, `lease_options`,
`etcd_options`, `SECURITY_OPTIONS`, `LOG_OPTIONS`); each process's own table is in its
command (`gazette_broker.cli`, `gazette_consumer.cli`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gazette.auth import SecurityConfig
from gazette.serving.process import LOG_FORMATS, LOG_LEVELS


@dataclass(frozen=True)
class Option:
    """One option: ``--flag``, its environment variable, the config field it sets, how
    its text converts, its default, and what it means (``--help`` and the docs say the
    same). `shown_default` says the default where its value would not (a generated name,
    every interface)."""

    flag: str
    env: str
    field: str
    type: Callable[[str], Any]
    help: str
    default: Any = ""
    shown_default: str = ""
    choices: tuple[str, ...] = ()

    def default_text(self) -> str:
        """The default as ``--help`` and the docs show it ("" when there is none)."""
        if self.shown_default:
            return self.shown_default
        if self.default is None or self.default == "":
            return ""
        return str(self.default)


def with_defaults(config_class: type, options: Iterable[Option]) -> tuple[Option, ...]:
    """`options` defaulting to the defaults of the fields of `config_class` (a
    dataclass) they set: the config's default is the flag's, written once."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    out = []
    for option in options:
        found = fields.get(option.field)
        if found is not None and found.default is not dataclasses.MISSING:
            option = dataclasses.replace(option, default=found.default)
        out.append(option)
    return tuple(out)


def flag_bool(text: str) -> bool:
    """A boolean flag's value: true/false, yes/no, on/off, 1/0."""
    value = text.strip().lower()
    if value in ("true", "yes", "on", "1"):
        return True
    if value in ("false", "no", "off", "0", ""):
        return False
    raise ValueError(f"{text!r} is not true or false")


flag_bool.__name__ = "boolean (true/false)"


def identity_options(kind: str, who: str) -> list[Option]:
    """Where a member is and how it is reached (``--broker.zone``, ``--consumer.port``,
    ...): `kind` names the flags, `who` is what the help calls the member."""
    env = kind.upper()
    return [
        Option(f"--{kind}.zone", f"{env}_ZONE", "zone", str, f"failure zone of this {who}"),
        Option(f"--{kind}.id", f"{env}_ID", "suffix", str,
               f"unique name of this {who} within its zone",
               shown_default="host name and a random tag"),
        Option(f"--{kind}.host", f"{env}_HOST", "host", str,
               f"host name other members and clients reach this {who} at"),
        Option(f"--{kind}.bind", f"{env}_BIND", "bind", str, "interface to listen on",
               shown_default="all"),
        Option(f"--{kind}.port", f"{env}_PORT", "port", int, "gRPC port (0: any free port)"),
    ]


def lease_options(kind: str, who: str, items: str) -> list[Option]:
    """How long a member's spec outlives it, and how long it drains its `items`."""
    env = kind.upper()
    return [
        Option(f"--{kind}.lease-ttl", f"{env}_LEASE_TTL", "lease_ttl", int,
               f"seconds the member spec outlives a {who} that died without cleaning up"),
        Option(f"--{kind}.drain-timeout", f"{env}_DRAIN_TIMEOUT", "drain_timeout", float,
               f"seconds a stopping {who} waits for its {items} to move to other {who}s"),
    ]


def etcd_options(who: str) -> list[Option]:
    """Where etcd is, and how long a starting member waits for it."""
    return [
        Option("--etcd.address", "ETCD_ADDRESS", "etcd_address", str,
               "etcd endpoint; a cluster's members comma-separated (IP addresses, or one "
               "DNS name resolving to them all): calls go to one that answers"),
        Option("--etcd.startup-timeout", "ETCD_STARTUP_TIMEOUT", "etcd_startup_timeout",
               float, f"seconds a starting {who} waits for etcd to answer (it retries "
               "meanwhile, logging what it waits for)"),
    ]


#: etcd's client TLS (the `etcd_*_file` fields of whatever config takes them).
ETCD_TLS_OPTIONS = (
    Option("--etcd.cert-file", "ETCD_CERT_FILE", "etcd_cert_file", str,
           "PEM client certificate toward etcd (with an https:// --etcd.address)"),
    Option("--etcd.key-file", "ETCD_KEY_FILE", "etcd_key_file", str,
           "PEM private key of --etcd.cert-file"),
    Option("--etcd.ca-file", "ETCD_CA_FILE", "etcd_ca_file", str,
           "PEM CA bundle verifying etcd's certificate"),
)

#: The security options of a serving member (fields of `gazette.auth.SecurityConfig`).
SECURITY_OPTIONS: tuple[Option, ...] = with_defaults(SecurityConfig, [
    Option("--tls.cert-file", "TLS_CERT_FILE", "tls_cert_file", str,
           "PEM certificate chain of the gRPC and HTTP listeners (TLS on when set), also "
           "the client certificate toward other members; re-read when it changes"),
    Option("--tls.key-file", "TLS_KEY_FILE", "tls_key_file", str,
           "PEM private key of --tls.cert-file"),
    Option("--tls.ca-file", "TLS_CA_FILE", "tls_ca_file", str,
           "PEM CA bundle verifying the members this one calls (and clients, with mTLS)"),
    Option("--tls.client-auth", "TLS_CLIENT_AUTH", "tls_client_auth", flag_bool,
           "require client certificates signed by --tls.ca-file (mutual TLS)"),
    Option("--auth.keys-file", "AUTH_KEYS_FILE", "auth_keys_file", str,
           "file of the cluster's token signing keys (base64, separated by whitespace or "
           "commas; the first signs, all verify): every request then needs a bearer token"),
    Option("--auth.token", "AUTH_TOKEN", "auth_token", str,
           "bearer token of this member's own calls, when it has no keys"),
    *ETCD_TLS_OPTIONS,
    Option("--log.access", "LOG_ACCESS", "log_access", flag_bool,
           "log one line per gRPC call: method, status, seconds, peer, caller"),
])

#: How a process logs (`gazette.serving.process.setup_logging`).
LOG_OPTIONS: tuple[Option, ...] = (
    Option("--log.level", "LOG_LEVEL", "log_level", str,
           "log level: debug, info, warn or error", default="info", choices=LOG_LEVELS),
    Option("--log.format", "LOG_FORMAT", "log_format", str,
           "log format: text, or json (one object per line)", default="text",
           choices=LOG_FORMATS),
)


def env_default(prog: str, env: str, convert: Callable[[str], Any], fallback: Any) -> Any:
    """The value of environment variable `env` (converted), else `fallback`; a value
    that does not convert exits with a message naming it."""
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return fallback
    try:
        return convert(raw)
    except ValueError:
        raise SystemExit(f"{prog}: ${env}={raw!r} is not a valid "
                         f"{getattr(convert, '__name__', 'value')}") from None


def add_options(parser: argparse.ArgumentParser, prog: str, options: Iterable[Option]
                ) -> None:
    """Declare `options` on `parser`, each defaulting to its environment variable, else
    to its default."""
    for option in options:
        shown = option.default_text()
        parser.add_argument(
            option.flag, dest=option.field, type=option.type,
            choices=option.choices or None,
            default=env_default(prog, option.env, option.type, option.default),
            help=f"{option.help} [${option.env}]" + (f" (default: {shown})" if shown else ""))


def config_values(args: argparse.Namespace, options: Sequence[Option]) -> dict[str, Any]:
    """The config fields `options` set in `args`; an empty value is left out (the
    config's own default then applies, e.g. a generated member name)."""
    values = {option.field: getattr(args, option.field) for option in options}
    return {k: v for k, v in values.items() if v != ""}


def markdown_table(options: Iterable[Option]) -> str:
    """The docs' table of `options`: flag, environment variable, default, meaning."""
    rows = ["| flag | env | default | meaning |", "|---|---|---|---|"]
    for option in options:
        default = option.shown_default or _shown_value(option.default)
        rows.append(f"| `{option.flag}` | `{option.env}` | {default} | {option.help} |")
    return "\n".join(rows) + "\n"


def _shown_value(value: Any) -> str:
    """A default value as the docs write it: sizes in MiB or GiB, numbers as typed."""
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value >> 30} GiB" if value % (1 << 30) == 0 else f"{value >> 20} MiB"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"
