"""``gazctl``: journals from the command line, as in the broker tutorial.

    gazctl journals list [-l SELECTOR] [--primary] [--format table|yaml|json]
    gazctl journals apply [-f FILE] [--dry-run]
    gazctl journals append (-l SELECTOR | JOURNAL) [--framing lines|none]
    gazctl journals read -l SELECTOR [--block] [--tail] [--offset N]
    gazctl journals fragments -l SELECTOR [--url] [--format table|json]

The broker is `--broker`, else ``$BROKER_ADDRESS``, else ``Address`` under
``[journals]`` in ``~/.config/gazette/gazctl.ini``, else http://localhost:8080.
(``edit`` and ``prune`` are not here yet.)
"""

from __future__ import annotations

import argparse
import asyncio
import configparser
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from gazette.client import ApplyConflict, BrokerError, JournalClient, Unavailable
from gazette.errors import GazetteError, ValidationError
from gazette.labels import Selector
from gazette.protocol.trees import journal_changes_from_yaml, specs_to_yaml

DEFAULT_ADDRESS = "http://localhost:8080"
LINES_BATCH = 1 << 20


def broker_address(flag: str | None, env: dict[str, str] | None = None) -> str:
    """--broker, then $BROKER_ADDRESS, then gazctl.ini, then the default."""
    env = dict(os.environ) if env is None else env
    if flag:
        return flag
    if env.get("BROKER_ADDRESS"):
        return env["BROKER_ADDRESS"]
    ini = Path(env.get("HOME", "~")).expanduser() / ".config" / "gazette" / "gazctl.ini"
    if ini.is_file():
        config = configparser.ConfigParser()
        config.read(ini)
        for section in ("journals", "broker"):
            if config.has_option(section, "Address"):
                return config.get(section, "Address")
    return DEFAULT_ADDRESS


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The tutorial's boxed table."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str], center: bool = False) -> str:
        return "|" + "|".join(f" {c.center(w) if center else c.ljust(w)} "
                              for c, w in zip(cells, widths, strict=True)) + "|"

    return "\n".join([rule, line(headers, True), rule, *(line(r) for r in rows), rule])


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def ago(mod_time: int, now: float | None = None) -> str:
    if not mod_time:
        return ""
    seconds = max(0, int((time.time() if now is None else now) - mod_time))
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = seconds // size
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return f"{seconds} second{'s' if seconds != 1 else ''} ago"


async def _selected(client: JournalClient, selector: str) -> list[str]:
    return [j.spec.name for j in (await client.list(Selector.parse(selector))).journals]


async def cmd_list(client: JournalClient, args: argparse.Namespace) -> int:
    listing = await client.list(Selector.parse(args.selector))
    if args.format == "yaml":
        print(specs_to_yaml([(j.spec, j.mod_revision) for j in listing.journals]), end="")
    elif args.format == "json":
        for j in listing.journals:
            print(json.dumps({"spec": j.spec.to_dict(), "mod_revision": j.mod_revision,
                              "route": {"members": list(j.route.members),
                                        "primary": j.route.primary}}))
    else:
        headers = ["NAME", *(["PRIMARY"] if args.primary else [])]
        rows = [[j.spec.name, *([j.route.primary_member.split("/")[-1]]
                                if args.primary else [])] for j in listing.journals]
        print(table(headers, rows))
    return 0


async def cmd_apply(client: JournalClient, args: argparse.Namespace) -> int:
    if args.file in (None, "-"):
        text = await asyncio.to_thread(sys.stdin.read)
    else:
        text = await asyncio.to_thread(Path(args.file).read_text)
    changes = journal_changes_from_yaml(text)
    if args.dry_run:
        print(f"would apply {len(changes)} changes", file=sys.stderr)
        return 0
    revision = await client.apply(changes)
    print(f"successfully applied revision={revision}", file=sys.stderr)
    return 0


async def cmd_append(client: JournalClient, args: argparse.Namespace) -> int:
    journals = [args.journal] if args.journal else await _selected(client, args.selector)
    if len(journals) != 1:
        raise ValidationError("-l", f"selects {len(journals)} journals; append needs "
                              "exactly one")
    journal = journals[0]
    stdin: Any = sys.stdin.buffer  # a BufferedReader: read1 returns what is available
    if args.framing == "none":
        data = await asyncio.to_thread(stdin.read)
        await client.append(journal, data)
        return 0
    pending = b""
    while True:  # whole lines, batched as they come
        block = await asyncio.to_thread(stdin.read1, LINES_BATCH)
        if not block:
            break
        pending += block
        cut = pending.rfind(b"\n") + 1
        if cut:
            await client.append(journal, pending[:cut])
            pending = pending[cut:]
    if pending:
        await client.append(journal, pending)
    return 0


async def cmd_read(client: JournalClient, args: argparse.Namespace) -> int:
    journals = await _selected(client, args.selector)
    out = sys.stdout.buffer

    async def one(journal: str) -> None:
        offset = -1 if args.tail else args.offset
        async for chunk in client.read(journal, offset, block=args.block):
            out.write(chunk.content)
            out.flush()

    await asyncio.gather(*(one(j) for j in journals))
    return 0


async def cmd_fragments(client: JournalClient, args: argparse.Namespace) -> int:
    ttl = timedelta(hours=24) if args.url else None
    rows, objs = [], []
    for journal in await _selected(client, args.selector):
        for info in await client.list_fragments(journal, signature_ttl=ttl):
            f = info.fragment
            objs.append({"journal": f.journal, "begin": f.begin, "end": f.end,
                         "sha1": f.sha1.hex(), "compression": f.codec.value,
                         "backing_store": f.backing_store, "mod_time": f.mod_time,
                         "signed_url": info.signed_url})
            rows.append([f.journal, str(f.begin), human_bytes(f.size), ago(f.mod_time),
                         f.sha1.hex()[:12] + "...", f.codec.value,
                         *([info.signed_url] if args.url else [])])
    if args.format == "json":
        for obj in objs:
            print(json.dumps(obj))
    else:
        print(table(["JOURNAL", "OFFSET", "LENGTH", "PERSISTED", "SHA1", "COMPRESSION",
                     *(["URL"] if args.url else [])], rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--broker", help="broker address [$BROKER_ADDRESS]")
    common.add_argument("--log.level", dest="log_level", default="info",
                        choices=["debug", "info", "warn", "error"])
    parser = argparse.ArgumentParser(prog="gazctl", parents=[common])
    sub = parser.add_subparsers(dest="noun", required=True)
    journals = sub.add_parser("journals", parents=[common], help="work with journals")
    verbs = journals.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("list", parents=[common], help="list journals")
    p.add_argument("-l", dest="selector", default="")
    p.add_argument("--primary", action="store_true")
    p.add_argument("--format", choices=["table", "yaml", "json"], default="table")
    p.set_defaults(run=cmd_list)
    p = verbs.add_parser("apply", parents=[common], help="apply a spec tree")
    p.add_argument("-f", dest="file")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(run=cmd_apply)
    p = verbs.add_parser("append", parents=[common], help="append stdin to a journal")
    p.add_argument("journal", nargs="?")
    p.add_argument("-l", dest="selector", default="")
    p.add_argument("--framing", choices=["lines", "none"], default="lines")
    p.set_defaults(run=cmd_append)
    p = verbs.add_parser("read", parents=[common], help="read journals to stdout")
    p.add_argument("-l", dest="selector", required=True)
    p.add_argument("--block", action="store_true")
    p.add_argument("--tail", action="store_true")
    p.add_argument("--offset", type=int, default=0)
    p.set_defaults(run=cmd_read)
    p = verbs.add_parser("fragments", parents=[common], help="list fragments")
    p.add_argument("-l", dest="selector", required=True)
    p.add_argument("--url", action="store_true")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(run=cmd_fragments)
    return parser


async def _run(args: argparse.Namespace) -> int:
    async with JournalClient(broker_address(args.broker)) as client:
        status: int = await args.run(client, args)
        return status


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except ApplyConflict as err:
        print(f"gazctl: not applied: {err}", file=sys.stderr)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            sys.stdout.close()
        return 0
    except (BrokerError, Unavailable, ValidationError, GazetteError, OSError) as err:
        print(f"gazctl: {err}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

