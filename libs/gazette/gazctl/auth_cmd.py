"""``gazctl auth issue``: a bearer token signed with one of the cluster's keys, for an
operator to hand to a team (``--capability append,read --selector prefix=team-a/``).

The token is printed on stdout alone (``TOKEN=$(gazctl auth issue ...)``); what it
grants and until when goes to stderr.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from gazette.auth import Capability, SigningKeys, parse_capabilities
from gazette.errors import ValidationError
from gazette.gazctl.config import UsageError, duration_arg
from gazette.gazctl.context import CommandError, Context
from gazette.labels import parse_selector


def capabilities_arg(text: str) -> frozenset[Capability]:
    try:
        caps = parse_capabilities(text, "capability")
    except ValidationError as err:
        raise argparse.ArgumentTypeError(err.reason) from None
    if not caps:
        raise argparse.ArgumentTypeError("name at least one capability")
    return caps


def selector_text(text: str) -> str:
    try:
        return str(parse_selector(text, "selector"))
    except ValidationError as err:
        raise argparse.ArgumentTypeError(err.reason) from None


async def issue(ctx: Context, args: argparse.Namespace) -> int:
    flag = "--keys-file" if args.keys_file else "$AUTH_KEYS_FILE"
    path = args.keys_file or ctx.env.get("AUTH_KEYS_FILE", "")
    if not path:
        raise UsageError("--keys-file (or $AUTH_KEYS_FILE) names the cluster's "
                         "signing keys")
    try:
        keys = SigningKeys.from_file(path, flag)
    except ValidationError as err:  # a bad flag value: exit 2
        raise UsageError(str(err)) from None
    ttl = args.ttl.total_seconds()
    if ttl <= 0:
        raise CommandError("--ttl must be more than zero")
    token = keys.issue(args.subject, args.capability, args.selector, ttl)
    ctx.echo(token)
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + ttl))
    ctx.stderr.write(f"token of {args.subject!r}: {', '.join(sorted(args.capability))} "
                     f"over {args.selector or 'everything'}, until {expires}\n")
    return 0


def add_parser(nouns: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
               ) -> None:
    """``gazctl auth`` and its verb, under `nouns`; `common`: the global flags."""
    noun = nouns.add_parser("auth", parents=[common], help="issue bearer tokens",
                            description="Issue bearer tokens signed with the cluster's keys.")
    noun.set_defaults(help_parser=noun)
    verbs = noun.add_subparsers(dest="verb", metavar="VERB")
    known = ", ".join(c.value for c in Capability)
    p = verbs.add_parser("issue", parents=[common], help="print a new token",
                         description="Print a token granting CAPABILITIES over what "
                                     "SELECTOR selects, signed with the first key of "
                                     "--keys-file.")
    p.set_defaults(run=issue)
    p.add_argument("--keys-file", default="", metavar="FILE",
                   help="the cluster's signing keys [$AUTH_KEYS_FILE]")
    p.add_argument("--subject", required=True, help="who the token is for (logged)")
    p.add_argument("--capability", "--capabilities", dest="capability", required=True,
                   type=capabilities_arg, metavar="CAPS",
                   help=f"comma-separated capabilities ({known})")
    p.add_argument("--selector", type=selector_text, default="", metavar="SELECTOR",
                   help="limit it to the journals or shards this selects, e.g. "
                        "prefix=team-a/ (default: all)")
    p.add_argument("--ttl", type=duration_arg, default=duration_arg("24h"),
                   metavar="DURATION", help="how long it is valid (default: 24h)")
