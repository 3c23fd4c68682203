"""The ``gazctl journals`` verbs fragments (list them, with signed URLs and how
persisting goes) and prune (remove those older than their journal's retention)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from gazette.client import (
    FragmentInfo,
)
from gazette.errors import ValidationError
from gazette.gazctl.context import (
    CommandError,
    Context,
    info,
    run_all,
    selected,
    warn,
)
from gazette.gazctl.output import Progress, ago, human_bytes, table
from gazette.protocol.journal_spec import SuspendLevel

# -- fragments -------------------------------------------------------------------------


def fragment_to_dict(info_: FragmentInfo) -> dict[str, Any]:
    """A fragment as ``fragments --format json`` prints it."""
    f = info_.fragment
    return {"journal": f.journal, "begin": f.begin, "end": f.end, "sha1": f.sha1.hex(),
            "compression_codec": f.codec.value, "backing_store": f.backing_store,
            "mod_time": f.mod_time, "path_postfix": f.path_postfix, "path": f.path,
            "signed_url": info_.signed_url, "persist_error": info_.persist_error}


def fragments_table(infos: Sequence[FragmentInfo], *, urls: bool = False,
                    now: float | None = None) -> str:
    """The tutorial's fragments table."""
    rows = []
    for item in infos:
        f = item.fragment
        persisted = ago(f.mod_time, now) if f.mod_time else (
            f"failing: {_short(item.persist_error)}" if item.persist_error else "")
        rows.append([f.journal, str(f.begin), human_bytes(f.size), persisted,
                     f.sha1.hex()[:12] + "...", f.codec.value,
                     *([item.signed_url] if urls else [])])
    return table(["JOURNAL", "OFFSET", "LENGTH", "PERSISTED", "SHA1", "COMPRESSION",
                  *(["URL"] if urls else [])], rows)


def _short(text: str, width: int = 80) -> str:
    """One line of at most `width` characters."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 3] + "..."


async def _fragments_of(ctx: Context, journals: Sequence[str], *, begin: int = 0,
                        end: int = 0, ttl: timedelta | None = None,
                        each: Callable[[str], None] | None = None,
                        ) -> dict[str, list[FragmentInfo]]:
    """The fragments of each journal, listed concurrently (a few at a time)."""
    found: dict[str, list[FragmentInfo]] = {}
    gate = asyncio.Semaphore(8)

    async def one(journal: str) -> None:
        async with gate:
            found[journal] = await ctx.client.list_fragments(
                journal, begin_mod_time=begin, end_mod_time=end, signature_ttl=ttl)
        if each is not None:
            each(journal)

    await run_all([one(j) for j in journals])
    return found


async def list_fragments(ctx: Context, journals: Sequence[str], *, begin: int = 0,
                            end: int = 0, ttl: timedelta | None = None,
                            ) -> dict[str, list[FragmentInfo]]:
    """`_fragments_of`, with a progress bar of the journals listed on a terminal's
    stderr (erased once they are all listed, or on failure)."""
    progress = Progress(len(journals), "journals listed", ctx.stderr)
    progress.update(0)
    try:
        return await _fragments_of(ctx, journals, begin=begin, end=end, ttl=ttl,
                                   each=progress.step)
    finally:
        progress.clear()


async def cmd_fragments(ctx: Context, args: argparse.Namespace) -> int:
    if args.to and args.from_ and args.to <= args.from_:
        raise CommandError("--to must be after --from")
    listed = await selected(ctx, args.selector)
    journals = [j.spec.name for j in listed
                if j.spec.suspend is None or j.spec.suspend.level != SuspendLevel.FULL]
    ttl = args.url_ttl or (args.signature_ttl if args.url else None)
    found = await list_fragments(ctx, journals, begin=args.from_, end=args.to, ttl=ttl)
    infos = [i for j in journals for i in found[j]]
    if args.format == "json":
        for item in infos:
            ctx.echo(json.dumps(fragment_to_dict(item)))
    else:
        ctx.echo(fragments_table(infos, urls=ttl is not None))
    return 0


# -- prune -----------------------------------------------------------------------------


def aged_fragments(infos: Sequence[FragmentInfo], retention: timedelta,
                   now: float) -> list[FragmentInfo]:
    """Persisted fragments at least `retention` old (none for a zero retention)."""
    if retention <= timedelta(0):
        return []
    keep_after = now - retention.total_seconds()
    return [i for i in infos
            if i.fragment.backing_store and i.fragment.mod_time
            and i.fragment.mod_time <= keep_after]


@dataclass
class PruneStats:
    """Counts of a prune (bytes are content bytes, not stored, compressed ones)."""

    journals: int = 0
    fragments: int = 0
    pruned: int = 0
    pruned_bytes: int = 0
    total_bytes: int = 0
    missing: int = 0
    missing_bytes: int = 0

    def summary(self, dry_run: bool) -> str:
        """One line: what was (or would be) pruned, what was missing, what is kept."""
        verb = "would prune" if dry_run else "pruned"
        kept = self.fragments - self.pruned - self.missing
        missing = (f"; {plural(self.missing, 'fragment')} not found in their stores"
                   if self.missing else "")
        return (f"{verb} {plural(self.pruned, 'fragment')} "
                f"({human_bytes(self.pruned_bytes)}) of {plural(self.journals, 'journal')}"
                f"{missing}; {plural(kept, 'fragment')} "
                f"({human_bytes(self.total_bytes - self.pruned_bytes - self.missing_bytes)})"
                " kept")


def plural(n: int, noun: str) -> str:
    """``1 fragment``, ``2 fragments``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


async def cmd_prune(ctx: Context, args: argparse.Namespace) -> int:
    listed = await selected(ctx, args.selector)
    if not listed:
        raise CommandError(f"no journals match the selector {args.selector.format()!r}")
    with_retention = [j for j in listed if j.spec.fragment.retention > timedelta(0)]
    for j in listed:
        if j not in with_retention:
            info("journal keeps its fragments for ever (retention 0s); skipped",
                 journal=j.spec.name)
    file_root = args.file_root or ctx.env.get("BROKER_FILE_ROOT") or None
    stats = PruneStats(journals=len(with_retention))
    found = await list_fragments(ctx, [j.spec.name for j in with_retention])
    now = time.time()
    aged: list[FragmentInfo] = []
    for j in with_retention:
        infos = found[j.spec.name]
        stats.fragments += len(infos)
        stats.total_bytes += sum(i.fragment.size for i in infos)
        old = aged_fragments(infos, j.spec.fragment.retention, now)
        aged += old
        info("fetched aged fragments", journal=j.spec.name, total=len(infos), aged=len(old))

    pruned = await remove_fragments(ctx, aged, stats, dry_run=args.dry_run,
                                    file_root=file_root)
    if pruned:
        ctx.echo(fragments_table(pruned, now=now))
    ctx.echo(stats.summary(args.dry_run))
    return 0


async def remove_fragments(ctx: Context, aged: Sequence[FragmentInfo], stats: PruneStats,
                           *, dry_run: bool, file_root: str | None) -> list[FragmentInfo]:
    """Remove `aged` from their stores (none with `dry_run`), counting into `stats`;
    returns those removed (or that would be)."""
    from gazette.fragment.store import FragmentStore, aclose_all, store_for

    stores: dict[str, FragmentStore] = {}
    if not dry_run:
        for url in sorted({i.fragment.backing_store for i in aged}):
            if url.startswith("file:") and not file_root:
                raise CommandError(
                    f"fragments are in the {url} store: give its folder with --file-root "
                    "(the broker's --broker.file-root, or $BROKER_FILE_ROOT)")
            try:
                stores[url] = store_for(url, file_root=Path(file_root) if file_root else None,
                                        env=ctx.env)
            except ValidationError as err:
                raise CommandError(f"cannot open store {url}: {err.reason}") from None
    progress = Progress(len(aged), "fragments pruned", ctx.stderr)
    pruned: list[FragmentInfo] = []
    try:
        for n, item in enumerate(aged):
            f = item.fragment
            progress.update(n, f.journal)
            if not dry_run:
                store = stores[f.backing_store]
                if not await store.exists(f):
                    stats.missing += 1
                    stats.missing_bytes += f.size
                    progress.clear()
                    warn("fragment not found in its store (removed already, or "
                         "--file-root is not the broker's)", journal=f.journal,
                         name=f.content_name, store=f.backing_store)
                    continue
                await store.remove(f)
            progress.clear()
            info("would prune fragment" if dry_run else "pruned fragment",
                 journal=f.journal, name=f.content_name, size=f.size, mod=f.mod_time)
            pruned.append(item)
            stats.pruned += 1
            stats.pruned_bytes += f.size
        progress.update(len(aged))
    finally:
        progress.clear()
        for store in stores.values():
            with contextlib.suppress(Exception):
                await store.close()
        if any(url.startswith("s3:") for url in stores):
            await aclose_all()
    return pruned
