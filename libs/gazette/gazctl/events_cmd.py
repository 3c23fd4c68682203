"""The ``gazctl events`` verbs, for the events library (`gazette.events`): create-topic
makes a topic's partition journals; dead-letters lists a consumer group's dead letters
of a topic; replay appends chosen ones to the group's retry journal, where the group's
retry shard hands them to their handler again.

Dead letters are read read-committed (a `Sequencer`): those of consumer transactions
that did not commit are not shown. `gazette.events` is imported only when a verb runs
(it brings the whole library: consumers, etcd), so other gazctl commands start fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from gazette.client import BrokerError
from gazette.client.connection import MAX_INT64
from gazette.errors import GazetteError, ValidationError
from gazette.gazctl.config import UsageError, bounded_int
from gazette.gazctl.context import Command, CommandError, Context, info, warn
from gazette.gazctl.output import table
from gazette.message import Envelope, FrameError
from gazette.names import validate_prefix
from gazette.protocol import Status

#: Characters of a dead letter's error shown in the table.
ERROR_WIDTH = 60


def name_arg(what: str) -> Callable[[str], str]:
    """A topic or group name (argparse type: a bad one is exit 2)."""
    def parse(text: str) -> str:
        from gazette.events.topic import validate_name

        try:
            return validate_name(text, what)
        except ValidationError as err:
            raise argparse.ArgumentTypeError(f"bad {what} name: {err.reason}") from None

    return parse


def prefix_arg(text: str) -> str:
    """Where topics' journals live: a journal-name prefix ending in ``/``."""
    try:
        if validate_prefix(text, "prefix"):
            return text
    except ValidationError as err:
        raise argparse.ArgumentTypeError(err.reason) from None
    raise argparse.ArgumentTypeError("must not be empty (a folder, such as events/)")


def offset_arg(text: str) -> int:
    return bounded_int(text, "a byte offset", 0, MAX_INT64)


def _prefix(args: argparse.Namespace) -> str:
    from gazette.events.topic import DEFAULT_PREFIX

    return str(args.prefix or DEFAULT_PREFIX)


async def _write_head(ctx: Context, journal: str, what: str, hint: str) -> int:
    """The write head of `journal`; CommandError naming it if it does not exist."""
    try:
        return await ctx.client.write_head(journal)
    except BrokerError as err:
        if err.status is not Status.JOURNAL_NOT_FOUND:
            raise
        raise CommandError(f"the {what} journal {journal} does not exist ({hint})") from None


# -- create-topic ----------------------------------------------------------------------


async def cmd_create_topic(ctx: Context, args: argparse.Namespace) -> int:
    from gazette.events.catalog import Catalog
    from gazette.events.topic import DEFAULT_PARTITIONS, TOPIC_LABEL, partition_specs

    topic, prefix = args.name, _prefix(args)
    try:
        specs = partition_specs(topic, args.partitions or DEFAULT_PARTITIONS, prefix=prefix,
                                replication=args.replication,
                                fragment_store=args.fragment_store)
    except ValidationError as err:
        raise UsageError(f"create-topic: {err}") from None
    try:
        made = await Catalog(ctx.client, prefix).ensure(specs)
    except GazetteError as err:
        raise CommandError(f"topic {topic}: {err}") from None
    for name in made:
        ctx.echo(name)
    created = set(made)
    listing = await ctx.client.list(f"prefix={prefix}{topic}/")
    existing = {j.spec.name: j.spec for j in listing.journals}
    parts = {n for n, s in existing.items() if topic in s.labels.values(TOPIC_LABEL)
             and n not in created}  # (listed after making ours: those are left out)
    for name in sorted(set(existing) & {s.name for s in specs} - parts - created):
        warn(f"the journal exists but is not labeled {TOPIC_LABEL}={topic}: it is no "
             "partition of the topic", journal=name)
    if created and parts:
        warn("partitions were added to an existing topic: some keys now map to another "
             "partition (their order holds only within each partition)", topic=topic)
    info("created the topic's missing partitions" if created
         else "the topic has its partitions already: nothing to create",
         topic=topic, created=len(created), partitions=len(parts) + len(created))
    return 0


# -- reading dead letters --------------------------------------------------------------


@dataclass
class DeadLetter:
    """A committed dead letter: where it is, and its JSON object without the UUID."""

    offset: int
    fields: dict[str, Any]

    def text(self, key: str) -> str:
        value = self.fields.get(key)
        return "" if value is None else str(value)


async def read_dead_letters(ctx: Context, journal: str, offset: int, hint: str
                            ) -> tuple[list[DeadLetter], int]:
    """The committed dead letters of `journal` from `offset` to its write head (now),
    and that write head: where the next read begins."""
    from gazette.message import Sequencer, framing_for, read_committed, read_uncommitted

    head = await _write_head(ctx, journal, "dead-letter", hint)
    if offset > head:
        raise CommandError(f"--offset {offset} is beyond the write head of {journal} "
                           f"({head})")
    framing = framing_for("application/x-ndjson")

    def skipped(err: FrameError) -> None:
        warn("skipping a line that is not a JSON object", journal=err.journal,
             offset=err.begin, error=err.reason)

    async def lines(begin: int, end: int) -> AsyncIterator[list[Envelope]]:
        async with contextlib.aclosing(ctx.patient.read(journal, begin,
                                                        end_offset=end)) as chunks:
            async for batch in read_uncommitted(journal, (bytes(c.content) async for c in
                                                          chunks), framing, begin, skipped):
                yield batch

    letters: list[DeadLetter] = []
    sequencer = Sequencer()
    if offset < head:
        def replay(_: str, begin: int, end: int) -> AsyncIterator[list[Envelope]]:
            return lines(begin, end)

        async for batch in read_committed(lines(offset, head), sequencer, replay):
            for env in batch:
                fields = {k: v for k, v in env.message.items() if k != "uuid"}
                if fields:  # else an ACK: it commits a transaction, is no dead letter
                    letters.append(DeadLetter(env.begin, fields))
    pending = sorted(s.begin for s in sequencer.producer_states() if s.begin >= 0)
    if pending:
        warn("dead letters of consumer transactions not committed (yet) are left out: "
             "they are in progress, or failed and are rolled back when their shard "
             f"recovers; should they commit, --offset {pending[0]} reads them (and again "
             "what follows)", journal=journal, transactions=len(pending))
    return letters, head


def letters_table(letters: list[DeadLetter]) -> str:
    rows = []
    for d in letters:
        error = " ".join(d.text("error").split())
        if len(error) > ERROR_WIDTH:
            error = error[:ERROR_WIDTH - 3] + "..."
        rows.append([str(d.offset), d.text("id"), d.text("handler"), d.text("attempt"),
                     error])
    return table(["offset", "id", "handler", "attempt", "error"], rows)


def _journals(args: argparse.Namespace) -> tuple[str, str, str]:
    """The dead-letter and retry journals of the topic in the group, and a hint for
    when they do not exist."""
    from gazette.events.topic import DEAD, RETRY, group_journal

    prefix = _prefix(args)
    hint = (f"is topic {args.topic} consumed by group {args.group}? see 'gazctl journals "
            f"list -l prefix={prefix}{args.topic}/'")
    return (group_journal(args.topic, args.group, DEAD, prefix),
            group_journal(args.topic, args.group, RETRY, prefix), hint)


async def cmd_dead_letters(ctx: Context, args: argparse.Namespace) -> int:
    dead, _, hint = _journals(args)
    letters, head = await read_dead_letters(ctx, dead, args.offset, hint)
    summary = (f"{len(letters)} dead letter(s) in {dead} from offset {args.offset}; "
               f"next: --offset {head}")
    if args.format == "json":
        for d in letters:
            ctx.echo(json.dumps({"offset": d.offset, **d.fields}))
        info(summary, count=len(letters), next_offset=head)
    else:
        ctx.echo(letters_table(letters))
        ctx.echo(summary)
    return 0


# -- replay ----------------------------------------------------------------------------


def retry_line(args: argparse.Namespace, dead: str, letter: DeadLetter, now: float) -> Any:
    """What the retry journal gets for `letter`: the event, due now, its first attempt."""
    from gazette.events.topic import failed_line

    return failed_line(letter.fields, topic=args.topic, group=args.group,
                       handler=letter.fields["handler"], attempt=0, retry_at=now,
                       source=f"replayed from {dead}@{letter.offset}")


async def cmd_replay(ctx: Context, args: argparse.Namespace) -> int:
    from gazette.client import AppendQueue
    from gazette.message import Partition, Publisher

    dead, retry, hint = _journals(args)
    letters, head = await read_dead_letters(ctx, dead, args.offset, hint)
    await _write_head(ctx, retry, "retry", hint)
    chosen = [d for d in letters
              if (args.handler is None or d.fields.get("handler") == args.handler)
              and (args.id is None or d.text("id") == args.id)]
    for d in [d for d in chosen if not d.text("handler")]:
        warn("skipping a dead letter that names no handler", journal=dead, offset=d.offset)
    chosen = [d for d in chosen if d.text("handler")]
    if chosen:
        ctx.echo(letters_table(chosen))
    if args.dry_run:
        ctx.echo(f"would replay {len(chosen)} of {len(letters)} dead letter(s) of {dead} "
                 f"into {retry} (dry run: nothing appended); next: --offset {head}")
        return 0
    now = time.time()
    part = Partition(retry, "application/x-ndjson")
    async with AppendQueue(ctx.patient, resend=True) as queue:
        publisher = Publisher(queue)
        futures = [publisher.publish_committed(lambda _: part, retry_line(args, dead, d, now))
                   for d in chosen]
        results = await asyncio.gather(*futures, return_exceptions=True)
    failed = [(d, r) for d, r in zip(chosen, results, strict=True)
              if isinstance(r, BaseException)]
    if failed:
        first, err = failed[0]
        reason = str(err) or type(err).__name__
        raise CommandError(f"replay into {retry}: {len(chosen) - len(failed)} of "
                           f"{len(chosen)} appended; the dead letter at offset "
                           f"{first.offset} and {len(failed) - 1} more failed: {reason}")
    ctx.echo(f"replayed {len(chosen)} of {len(letters)} dead letter(s) of {dead} into "
             f"{retry}; next: --offset {head}")
    return 0


# -- the command line ------------------------------------------------------------------


def add_parser(nouns: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
               ) -> None:
    """``gazctl events`` and its verbs, under `nouns`; `common`: the global flags."""
    raw = argparse.RawDescriptionHelpFormatter
    noun = nouns.add_parser("events", parents=[common], help="work with events topics",
                            description="Create topics of the events library, and list "
                                        "and replay consumer groups' dead letters.")
    noun.set_defaults(help_parser=noun)
    verbs = noun.add_subparsers(dest="verb", metavar="VERB")

    def verb(name: str, run: Command, help_: str, description: str
             ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = verbs.add_parser(
            name, parents=[common], help=help_, formatter_class=raw, description=description)
        p.set_defaults(run=run)
        p.add_argument("--prefix", type=prefix_arg, default=None, metavar="PREFIX",
                       help="where topics' journals live (default: events/)")
        return p

    def group(p: argparse.ArgumentParser) -> None:
        p.add_argument("--topic", type=name_arg("topic"), required=True, help="the topic")
        p.add_argument("--group", type=name_arg("group"), required=True,
                       help="the consumer group")
        p.add_argument("--offset", type=offset_arg, default=0, metavar="N",
                       help="read the dead-letter journal from byte offset N, as the "
                            "last run's 'next: --offset N' says (default: 0)")

    p = verb("create-topic", cmd_create_topic, "create a topic's partition journals",
             "Create the partition journals PREFIX/NAME/part-NNN of a topic (those\n"
             "missing, if some exist), labeled as the events library finds them, and\n"
             "print the ones created.")
    p.add_argument("name", type=name_arg("topic"), metavar="NAME", help="the topic's name")
    p.add_argument("--partitions", default=None, metavar="N",
                   type=lambda t: bounded_int(t, "a number of partitions", 1, 1024),
                   help="how many partition journals (1-1024, default: 4)")
    p.add_argument("--replication", type=int, default=1, metavar="R",
                   help="replication factor of each journal (default: 1)")
    p.add_argument("--fragment-store", default="file:///", metavar="URL",
                   help="fragment store of the journals (default: file:///)")

    p = verb("dead-letters", cmd_dead_letters, "list a group's dead letters of a topic",
             "List the dead letters of a topic in a consumer group, from --offset to the\n"
             "write head of its dead-letter journal (those of consumer transactions\n"
             "that did not commit are not shown), and the offset to read on from.")
    group(p)
    p.add_argument("-o", "--format", choices=("table", "json"), default="table",
                   help="output format: a table, or one JSON object a dead letter with "
                        "its data (default: table)")

    p = verb("replay", cmd_replay, "send dead letters to their handler again",
             "Append the dead letters from --offset on (only those of --handler and of\n"
             "--id, if given) to the group's retry journal, due now with attempt 0: the\n"
             "group's retry shard hands each to its handler again. Prints the --offset\n"
             "to use next time, so that a second run does not replay them again.")
    group(p)
    p.add_argument("--handler", default=None, metavar="NAME",
                   help="only the dead letters of this handler")
    p.add_argument("--id", default=None, metavar="EVENT_ID",
                   help="only the dead letter(s) of this event id")
    p.add_argument("--dry-run", action="store_true",
                   help="show what would be replayed, append nothing")
