"""gazctl's command line: the parser of every noun, verb and flag (each command's
module adds its own), the checks argparse cannot express, the version, and the exit
statuses; `gazette.gazctl.__main__` runs what it parses."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, NoReturn

from gazette.gazctl.config import (
    MAX_TXN_SIZE,
    UsageError,
    duration_arg,
    journal_arg,
    offset_arg,
    selector_arg,
    size_arg,
    time_arg,
    txn_size_arg,
)
from gazette.gazctl.framing import MAX_RECORD
from gazette.gazctl.output import LOG_LEVELS
from gazette.labels import Selector

if TYPE_CHECKING:
    from gazette.gazctl.context import Command

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: The distribution gazctl comes in (pyproject.toml's ``name``): where its version is.
DISTRIBUTION = "gazette-py"


def version() -> str:
    """The installed distribution's version; a placeholder when run from a source tree
    that was never installed (there is no other place to read it from)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)


def _global_flags() -> Parser:
    """Flags every (sub)command takes; SUPPRESS so a later level does not reset them."""
    common = Parser(add_help=False)
    group = common.add_argument_group("global flags")
    group.add_argument("--broker", "--broker.address", dest="broker",
                       default=argparse.SUPPRESS, metavar="ADDRESS",
                       help="broker address, host:port, http://host:port or "
                            "https://host:port (TLS) [$BROKER_ADDRESS, gazctl.ini] "
                            "(default: localhost:8080)")
    group.add_argument("--auth.token", dest="auth_token", default=argparse.SUPPRESS,
                       metavar="TOKEN", help="bearer token of every request [$AUTH_TOKEN]")
    group.add_argument("--tls.ca-file", dest="tls_ca_file", default=argparse.SUPPRESS,
                       metavar="FILE", help="talk TLS, verifying servers with this PEM CA "
                                            "bundle [$TLS_CA_FILE]")
    group.add_argument("--tls.cert-file", dest="tls_cert_file", default=argparse.SUPPRESS,
                       metavar="FILE", help="client certificate, for servers that require "
                                            "one (mTLS) [$TLS_CERT_FILE]")
    group.add_argument("--tls.key-file", dest="tls_key_file", default=argparse.SUPPRESS,
                       metavar="FILE", help="key of --tls.cert-file [$TLS_KEY_FILE]")
    group.add_argument("--log.level", dest="log_level", choices=LOG_LEVELS,
                       default=argparse.SUPPRESS, help="log level [$LOG_LEVEL] (default: info)")
    group.add_argument("--log.format", dest="log_format", choices=("text", "json"),
                       default=argparse.SUPPRESS,
                       help="log format [$LOG_FORMAT] (default: text)")
    return common


def build_parser() -> Parser:
    """The whole command line."""
    from gazette.gazctl import apply as apply_cmd
    from gazette.gazctl import auth_cmd, events_cmd
    from gazette.gazctl import fragments as fragments_cmd
    from gazette.gazctl import journals as cmd
    from gazette.gazctl import shards as shards_cmd

    common = _global_flags()
    raw = argparse.RawDescriptionHelpFormatter
    parser = Parser(prog="gazctl", parents=[common], formatter_class=raw,
                    description="gazctl talks to Gazette brokers and consumers.",
                    epilog="Run 'gazctl journals --help' or 'gazctl shards --help' for "
                           "their commands.")
    parser.add_argument("--version", action="version", version=f"gazctl {version()}",
                        help="print gazctl's version and exit")
    parser.set_defaults(help_parser=parser, verb=None)
    nouns = parser.add_subparsers(dest="noun", metavar="COMMAND")
    journals = nouns.add_parser("journals", parents=[common], help="work with journals",
                                description="List, apply, edit, append to, read, and "
                                            "inspect the fragments of journals.")
    journals.set_defaults(help_parser=journals)
    verbs = journals.add_subparsers(dest="verb", metavar="VERB")

    def txn_size(p: Parser) -> None:
        p.add_argument("--max-txn-size", type=txn_size_arg, default=MAX_TXN_SIZE,
                       metavar="N",
                       help="apply at most N changes in one transaction: more go in "
                            "batches, each atomic, the whole not "
                            f"(1-{MAX_TXN_SIZE}, default: {MAX_TXN_SIZE})")

    def verb(name: str, run: Command, help_: str, description: str) -> Parser:
        p: Parser = verbs.add_parser(name, parents=[common], help=help_, formatter_class=raw,
                                     description=description)
        p.set_defaults(run=run)
        return p

    def selector(p: Parser, required: bool, what: str) -> None:
        p.add_argument("-l", "--selector", type=selector_arg, required=required,
                       default=None if required else Selector(), metavar="SELECTOR",
                       help=f"label selector of the journals {what}, e.g. "
                            "'prefix=foobar/, name not in (foobar/part-001)'")

    p = verb("list", cmd.cmd_list, "list journals",
             "List journals matching a selector: a table (with --primary, --replicas, "
             "...\ncolumns), the YAML spec tree with each journal's revision (for apply),"
             "\nor one JSON object a journal.")
    selector(p, False, "to list (default: all)")
    p.add_argument("-o", "--format", choices=("table", "yaml", "json"), default="table",
                   help="output format (default: table)")
    p.add_argument("-p", "--primary", action="store_true", help="show the primary column")
    p.add_argument("-r", "--replicas", action="store_true", help="show the replicas column")
    p.add_argument("--rf", action="store_true", help="show the replication factor column")
    p.add_argument("--stores", action="store_true", help="show the fragment stores column")
    p.add_argument("-L", "--label-columns", action="append", default=[], metavar="LABEL",
                   help="show a label's values as a column (repeatable)")

    p = verb("apply", apply_cmd.cmd_apply, "apply journal specs from YAML",
             "Apply a YAML tree of journal specs (as 'list --format yaml' prints it) in\n"
             "one transaction (more than --max-txn-size changes: in batches, each one\n"
             "transaction). A spec with 'revision: N' is applied only if the journal\n"
             "is still at revision N; without one, only if it does not exist yet.\n"
             "'delete: true' deletes a journal. With etcd's address (--etcd.address),\n"
             "a journal whose stores no registered broker serves is refused, unless\n"
             "--allow-unserved-stores.")
    p.add_argument("-f", "--specs", dest="file", default="-", metavar="FILE",
                   help="YAML file to apply, '-' for stdin (default: -)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and show the changes, apply nothing")
    p.add_argument("--etcd.address", dest="etcd_address", default="", metavar="URL",
                   help="etcd of the broker cluster, to check that a registered broker "
                        "serves each journal's stores [$ETCD_ADDRESS] (default: none, "
                        "no check)")
    p.add_argument("--etcd.prefix", dest="etcd_prefix", default="", metavar="PREFIX",
                   help="etcd prefix of the broker cluster [$ETCD_PREFIX] "
                        "(default: /gazette/cluster)")
    p.add_argument("--allow-unserved-stores", action="store_true",
                   help="apply journals whose stores no registered broker serves (they "
                        "are not assigned until one does)")
    txn_size(p)

    p = verb("edit", apply_cmd.cmd_edit, "edit journal specs in $EDITOR",
             "List the selected journals' specs into a temporary YAML file, open it in\n"
             "$EDITOR (default: vi), and apply what you saved, with revision checks.")
    selector(p, True, "to edit")
    txn_size(p)

    p = verb("append", cmd.cmd_append, "append stdin to a journal",
             "Append the input to one journal, streaming it as it arrives. With lines\n"
             "(the default) or fixed framing, whole records are batched into appends\n"
             "(up to 1 MiB, or what came within 100 ms) and never split between them;\n"
             "with none, all of the input is one atomic append.")
    p.add_argument("journal", nargs="?", type=journal_arg, help="the journal to append to")
    p.add_argument("-l", "--selector", type=selector_arg, default=None, metavar="SELECTOR",
                   help="label selector matching exactly one journal (instead of JOURNAL)")
    p.add_argument("--framing", choices=("lines", "none", "fixed"), default="lines",
                   help="records of the input (default: lines)")
    p.add_argument("-i", "--input", default="-", metavar="FILE",
                   help="input file, '-' for stdin (default: -)")
    p.add_argument("--max-record-size", type=size_arg, default=MAX_RECORD, metavar="BYTES",
                   help="longest line or frame (and append) of lines or fixed framing: "
                        "a longer one is an error (default: 268435456, 256 MiB, the "
                        "broker's default --broker.max-append-size)")

    p = verb("read", cmd.cmd_read, "read journals to stdout",
             "Write the content of the selected journals to stdout, from offset 0 (or\n"
             "--offset, or the write head with --tail) up to their write heads, or for\n"
             "ever with --block. Journals are read concurrently; their content is\n"
             "written in whole chunks, never interleaved within one.")
    selector(p, True, "to read")
    p.add_argument("-b", "--block", action="store_true",
                   help="do not stop at the write head: wait for and stream new content")
    p.add_argument("--tail", action="store_true", help="start at the write head")
    p.add_argument("--offset", type=offset_arg, default=0, metavar="N",
                   help="start at byte offset N (default: 0)")
    p.add_argument("--direct", action="store_true",
                   help="read persisted fragments straight from their stores")

    p = verb("fragments", fragments_cmd.cmd_fragments, "list fragments of journals",
             "List the fragments of the selected journals as a table or JSON lines.\n"
             "TIME is Unix seconds, an ISO 8601 time (2026-01-02T15:04:05Z) or a\n"
             "duration ago (1h).")
    selector(p, False, "(default: all)")
    p.add_argument("--from", dest="from_", type=time_arg, default=0, metavar="TIME",
                   help="only fragments persisted at or after TIME")
    p.add_argument("--to", type=time_arg, default=0, metavar="TIME",
                   help="only fragments persisted before TIME")
    p.add_argument("--url", action="store_true", help="add signed GET URLs (URL column)")
    p.add_argument("--signature-ttl", type=duration_arg, default=timedelta(hours=24),
                   metavar="DURATION", help="how long --url URLs are valid (default: 24h)")
    p.add_argument("--url-ttl", type=duration_arg, default=None, metavar="DURATION",
                   help="like --url --signature-ttl DURATION")
    p.add_argument("-o", "--format", choices=("table", "json"), default="table",
                   help="output format (default: table)")

    p = verb("prune", fragments_cmd.cmd_prune, "remove fragments older than their retention",
             "Remove the persisted fragments of the selected journals that are older\n"
             "than their spec's fragment.retention (journals without one are skipped)\n"
             "from their stores, and print what went. file:// stores need --file-root.")
    selector(p, True, "to prune")
    p.add_argument("--dry-run", action="store_true", help="show what would be removed")
    p.add_argument("--file-root", metavar="DIR", default=None,
                   help="folder of file:// stores: the broker's --broker.file-root "
                        "[$BROKER_FILE_ROOT]")

    shards_cmd.add_parser(nouns, common, txn_size)
    events_cmd.add_parser(nouns, common)
    auth_cmd.add_parser(nouns, common)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Flag combinations argparse cannot express; UsageError."""
    if args.verb == "append":
        if args.journal and args.selector is not None:
            raise UsageError("append: give a JOURNAL or -l SELECTOR, not both")
        if not args.journal and args.selector is None:
            raise UsageError("append: give the JOURNAL to append to, or -l SELECTOR")
    if args.verb == "read" and args.tail and args.offset:
        raise UsageError("read: --tail and --offset exclude each other")
