"""The ``gazctl shards`` verbs, against a consumer member's Shard service
(``--consumer.address``): list (status, primary, lag), apply and edit (the journals' YAML
flow with revision guards, `gazctl.apply`), unassign, hints and prune.

Lag needs a broker too (``--broker``): a shard's lag is, summed over its sources, the
journal's write head less the offset the shard has read through (its Stat).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import yaml

from gazette.client import BrokerError, FragmentInfo, ListedShard, ShardClient, ShardError
from gazette.gazctl.apply import SpecKind, apply_specs, edit_specs
from gazette.gazctl.checks import Check, sources_check
from gazette.gazctl.config import selector_arg, shard_arg
from gazette.gazctl.context import Command, CommandError, Context, info, warn
from gazette.gazctl.fragments import (
    PruneStats,
    fragments_table,
    list_fragments,
    remove_fragments,
)
from gazette.gazctl.journals import route_to_dict
from gazette.gazctl.output import table
from gazette.labels import Selector
from gazette.protocol import ShardSpec, ShardStatus
from gazette.protocol.status import Status
from gazette.protocol.trees import shard_changes_from_yaml, specs_to_yaml
from gazette.recoverylog import Hints

#: A shards verb: runs with the context, a client of the consumer member, its arguments.
ShardsVerb = Callable[[Context, ShardClient, argparse.Namespace], Awaitable[int]]

#: Stat statuses of a shard that has no running primary to ask: its lag is unknown.
NOT_RUNNING = frozenset({ShardStatus.NO_SHARD_PRIMARY, ShardStatus.NOT_SHARD_PRIMARY,
                         ShardStatus.SHARD_STOPPED, ShardStatus.SHARD_NOT_FOUND})

NO_RECOVERY_LOGS = ("it has not recovered from a recovery log yet (or has no "
                    "recovery_log_prefix)")


def command(verb: ShardsVerb) -> Command:
    """`verb` as a gazctl command: with a client of the consumer member, retried as
    little as the context's short-request client (an unreachable member is reported
    at once)."""
    async def run(ctx: Context, args: argparse.Namespace) -> int:
        async with ShardClient(args.consumer_address.address, retry=ctx.client.retry,
                               auth=ctx.client.auth) as c:
            return await verb(ctx, c, args)

    return run


def shard_kind(client: ShardClient, check: Check | None = None) -> SpecKind[ShardSpec]:
    """Shards, for `gazctl.apply`'s apply and edit; `check` before applying."""
    async def current(selector: Selector) -> list[tuple[ShardSpec, int]]:
        return [(s.spec, s.mod_revision) for s in await client.list(selector)]

    return SpecKind("shard", "consumer member", "id", shard_changes_from_yaml, client.apply,
                    current, check)


# -- list ------------------------------------------------------------------------------


def status_text(shard: ListedShard) -> str:
    """The shard's status on one line, as the operator shows it: its replicas' combined
    status (the most advanced: ``failed: <error>``, else ``primary``, ...), or why it
    has none (``disabled``, ``unassigned``)."""
    if shard.spec.disable:
        return "disabled"
    if not shard.route.members:
        return "unassigned"
    status = shard.status
    if status is None:
        return "unknown"  # the member reported no replica statuses
    return " ".join(str(status).split())


def shard_to_dict(shard: ListedShard) -> dict[str, Any]:
    """A listed shard as ``--format json`` prints it."""
    return {"id": shard.spec.id, "spec": shard.spec.to_dict(),
            "mod_revision": shard.mod_revision, "create_revision": shard.create_revision,
            "route": route_to_dict(shard.route),
            "status": [{"state": s.state.name.lower(), "error": s.error}
                       for s in shard.statuses],
            "combined_status": status_text(shard)}


async def _heads(ctx: Context, journals: set[str]) -> dict[str, int | None]:
    """The write head of each journal (None, with a warning, for one that is missing)."""
    async def head(journal: str) -> int | None:
        try:
            return await ctx.client.write_head(journal)
        except BrokerError as err:
            if err.status is not Status.JOURNAL_NOT_FOUND:
                raise
            warn("a source journal does not exist: its shards' lag is unknown",
                 journal=journal)
            return None

    ordered = sorted(journals)
    return dict(zip(ordered, await asyncio.gather(*(head(j) for j in ordered)), strict=True))


async def lags(ctx: Context, client: ShardClient, shards: list[ListedShard]
               ) -> dict[str, int | None]:
    """Each shard's lag in bytes: over its sources, the write head less what the shard
    has read through (at least its source's min_offset). None if it is not running."""
    heads = await _heads(ctx, {s.journal for shard in shards for s in shard.spec.sources})

    async def lag(shard: ListedShard) -> int | None:
        try:
            stat = await client.stat(shard.spec.id)
        except ShardError as err:
            if err.status in NOT_RUNNING:
                return None
            raise
        total = 0
        for source in shard.spec.sources:
            head = heads[source.journal]
            if head is None:
                return None
            done = max(stat.read_through.get(source.journal, 0), source.min_offset)
            total += max(0, head - done)
        return total

    return dict(zip([s.spec.id for s in shards],
                    await asyncio.gather(*(lag(s) for s in shards)), strict=True))


def shards_table(shards: list[ListedShard], *, primary: bool = False,
                 lag: dict[str, int | None] | None = None) -> str:
    """The ``shards list`` table: ID and STATUS, then the columns asked for."""
    headers = ["ID", "STATUS", *(["PRIMARY"] if primary else []),
               *(["LAG"] if lag is not None else [])]
    rows = []
    for shard in shards:
        row = [shard.spec.id, status_text(shard)]
        if primary:
            row.append(shard.route.primary_id.suffix if shard.route.primary_id else "")
        if lag is not None:
            value = lag.get(shard.spec.id)
            row.append("" if value is None else str(value))
        rows.append(row)
    return table(headers, rows)


async def cmd_list(ctx: Context, client: ShardClient, args: argparse.Namespace) -> int:
    shards = await client.list(args.selector)
    if args.format == "yaml":
        ctx.stdout.write(specs_to_yaml([(s.spec, s.mod_revision) for s in shards]).encode())
        ctx.stdout.flush()
        return 0
    lag = await lags(ctx, client, shards) if args.lag else None
    if args.format == "json":
        for shard in shards:
            out = shard_to_dict(shard)
            if lag is not None:
                out["lag"] = lag[shard.spec.id]
            ctx.echo(json.dumps(out))
    else:
        ctx.echo(shards_table(shards, primary=args.primary, lag=lag))
    return 0


# -- apply, edit -----------------------------------------------------------------------


async def cmd_apply(ctx: Context, client: ShardClient, args: argparse.Namespace) -> int:
    return await apply_specs(ctx, args, shard_kind(client, sources_check(ctx.client, args)))


async def cmd_edit(ctx: Context, client: ShardClient, args: argparse.Namespace) -> int:
    return await edit_specs(ctx, args, shard_kind(client))


# -- unassign, hints, prune --------------------------------------------------------------


async def cmd_unassign(ctx: Context, client: ShardClient, args: argparse.Namespace) -> int:
    ids = [s.spec.id for s in await client.list(args.selector)]
    if not ids:
        raise CommandError(f"no shards match the selector {args.selector.format()!r}")
    done = await client.unassign(ids, only_failed=args.failed, dry_run=args.dry_run)
    for shard in done:
        ctx.echo(shard)
    if args.dry_run:
        info("dry run: nothing was unassigned", shards=len(done))
    elif done:
        info("unassigned; the allocator assigns them anew", shards=len(done))
    else:
        info("no shard was unassigned" + (" (none has a failed replica)" if args.failed
                                          else " (none is assigned)"))
    return 0


async def cmd_hints(ctx: Context, client: ShardClient, args: argparse.Namespace) -> int:
    hints = await client.get_hints(args.shard)
    out = hints.to_dict()
    if args.format == "json":
        ctx.echo(json.dumps(out))
    else:
        ctx.stdout.write(yaml.safe_dump(out, sort_keys=False).encode())
        ctx.stdout.flush()
    if hints.empty:
        info(f"shard {args.shard} has no recovery-log hints: {NO_RECOVERY_LOGS}")
    return 0


async def cmd_prune(ctx: Context, client: ShardClient, args: argparse.Namespace) -> int:
    """Once, or every ``--every`` seconds until interrupted."""
    while True:
        await prune_once(ctx, client, args)
        if not args.every:
            return 0
        await asyncio.sleep(args.every)


async def prune_once(ctx: Context, client: ShardClient, args: argparse.Namespace) -> None:
    """Remove the fragments of each selected shard's recovery log that end before the
    first offset any of its hints (primary or backup) reads from. A shard with no
    hints keeps its whole log."""
    logged = [s for s in await client.list(args.selector) if s.spec.recovery_log]
    if not logged:
        ctx.echo("None of the selected shards has a recovery_log_prefix.")
        return
    found = await asyncio.gather(*(client.get_hints(s.spec.id) for s in logged))
    keep: dict[str, int] = {}
    for shard, hints in zip(logged, found, strict=True):
        present = [Hints.from_pb(h) for h in (hints.primary, *hints.backups) if h]
        if not present:
            info(f"shard {shard.spec.id} has no hints: {NO_RECOVERY_LOGS}; its log is "
                 "kept whole", log=shard.spec.recovery_log)
            continue
        keep[str(shard.spec.recovery_log)] = min(h.first_offset() for h in present)
    file_root = args.file_root or ctx.env.get("BROKER_FILE_ROOT") or None
    stats = PruneStats(journals=len(keep))
    listed = await list_fragments(ctx, list(keep))
    unneeded: list[FragmentInfo] = []
    for log_name, infos in listed.items():
        stats.fragments += len(infos)
        stats.total_bytes += sum(i.fragment.size for i in infos)
        old = [i for i in infos if i.fragment.backing_store and
               i.fragment.end <= keep[log_name]]
        unneeded += old
        info("hints need the log from", log=log_name, offset=keep[log_name],
             fragments=len(infos), unneeded=len(old))
    pruned = await remove_fragments(ctx, unneeded, stats, dry_run=args.dry_run,
                                    file_root=file_root)
    if pruned:
        ctx.echo(fragments_table(pruned))
    ctx.echo(stats.summary(args.dry_run))


# -- the command line ------------------------------------------------------------------


def add_parser(nouns: argparse._SubParsersAction[Any], common: argparse.ArgumentParser,
               txn_size: Callable[[Any], None]) -> None:
    """``gazctl shards`` and its verbs, under `nouns`; `common`: the global flags,
    `txn_size`: adds ``--max-txn-size`` (as journals apply and edit have it)."""
    consumer = argparse.ArgumentParser(add_help=False)
    consumer.add_argument("--consumer", "--consumer.address", dest="consumer",
                          default=argparse.SUPPRESS, metavar="ADDRESS",
                          help="consumer member address, host:port or http://host:port "
                               "[$CONSUMER_ADDRESS, gazctl.ini] (default: localhost:8090)")
    parents = [common, consumer]
    raw = argparse.RawDescriptionHelpFormatter
    noun = nouns.add_parser("shards", parents=parents, help="work with consumer shards",
                            description="List, apply, edit, unassign and inspect the "
                                        "shards of a consumer application.")
    noun.set_defaults(help_parser=noun)
    verbs = noun.add_subparsers(dest="verb", metavar="VERB")

    def verb(name: str, run: ShardsVerb, help_: str, description: str
             ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = verbs.add_parser(
            name, parents=parents, help=help_, formatter_class=raw, description=description)
        p.set_defaults(run=command(run))
        return p

    def selector(p: argparse.ArgumentParser, required: bool, what: str) -> None:
        p.add_argument("-l", "--selector", type=selector_arg, required=required,
                       default=None if required else Selector(), metavar="SELECTOR",
                       help=f"label selector of the shards {what}, e.g. "
                            "'id=acme/part-000' or 'prefix=acme/, app in (a, b)'")

    p = verb("list", cmd_list, "list shards",
             "List shards matching a selector: a table of their status (the greatest of\n"
             "their replicas': failed with its error, else primary, ...), the YAML spec\n"
             "tree with each shard's revision (for apply), or one JSON object a shard.")
    selector(p, False, "to list (default: all)")
    p.add_argument("-o", "--format", choices=("table", "yaml", "json"), default="table",
                   help="output format (default: table)")
    p.add_argument("-p", "--primary", action="store_true", help="show the primary column")
    p.add_argument("--lag", action="store_true",
                   help="show each shard's lag (table and json): bytes of its sources "
                        "not read yet (asks the broker, --broker, for write heads)")

    p = verb("apply", cmd_apply, "apply shard specs from YAML",
             "Apply a YAML tree of shard specs (as 'list --format yaml' prints it) in one\n"
             "transaction. A spec with 'revision: N' is applied only if the shard is\n"
             "still at revision N; without one, only if it does not exist yet.\n"
             "'delete: true' deletes a shard. A shard whose source journal does not\n"
             "exist (the broker is asked) is refused, unless --allow-missing-journals.")
    p.add_argument("-f", "--specs", dest="file", default="-", metavar="FILE",
                   help="YAML file to apply, '-' for stdin (default: -)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate and show the changes, apply nothing")
    p.add_argument("--allow-missing-journals", action="store_true",
                   help="apply shards whose source journals do not exist yet (else they "
                        "are refused; the broker, --broker, is asked)")
    txn_size(p)

    p = verb("edit", cmd_edit, "edit shard specs in $EDITOR",
             "List the selected shards' specs into a temporary YAML file, open it in\n"
             "$EDITOR (default: vi), and apply what you saved, with revision checks.")
    selector(p, True, "to edit")
    txn_size(p)

    p = verb("unassign", cmd_unassign, "unassign shards so they are re-assigned",
             "Remove the assignments of the selected shards (with --failed, only those\n"
             "of FAILED replicas): the allocator assigns them anew and they restart.\n"
             "Prints the shards unassigned.")
    selector(p, True, "to unassign")
    p.add_argument("--failed", action="store_true",
                   help="only unassign replicas whose status is FAILED")
    p.add_argument("--dry-run", action="store_true",
                   help="show what would be unassigned, change nothing")

    p = verb("hints", cmd_hints, "show a shard's recovery-log hints",
             "Print a shard's recovery-log hints (its primary's and the backups): empty\n"
             "until it has recovered from its recovery log once.")
    p.add_argument("--shard", type=shard_arg, required=True, metavar="ID",
                   help="the shard's ID")
    p.add_argument("-o", "--format", choices=("yaml", "json"), default="yaml",
                   help="output format (default: yaml)")

    p = verb("prune", cmd_prune, "prune recovery-log fragments no shard needs",
             "Remove the fragments of the selected shards' recovery logs that end before\n"
             "the first offset any of a shard's hints (primary or backup) plays from.\n"
             "A shard without hints keeps its whole log. With --every, again and again.")
    selector(p, False, "whose recovery logs to prune (default: all)")
    p.add_argument("--dry-run", action="store_true", help="show what would be removed")
    p.add_argument("--file-root", default=None, metavar="DIR",
                   help="folder of file:// fragment stores (the broker's "
                        "--broker.file-root) [$BROKER_FILE_ROOT]")
    p.add_argument("--every", type=float, default=0, metavar="SECONDS",
                   help="prune again every SECONDS until interrupted (default: once)")
