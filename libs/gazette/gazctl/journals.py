"""The ``gazctl journals`` verbs list, append, read, fragments and prune, and what every
verb shares (`Context`, `CommandError`, logging); apply and edit are in `gazctl.apply`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, TextIO

from gazette.client import (
    FragmentInfo,
    JournalClient,
    ListedJournal,
    Route,
)
from gazette.errors import GazetteError, ValidationError
from gazette.fragment import Fragment
from gazette.gazctl.framing import (
    FramingError,
    InputPump,
    RecordTooLong,
    batches,
    fixed_boundary,
    lines_boundary,
)
from gazette.gazctl.output import Progress, ago, human_bytes, table
from gazette.labels import Selector
from gazette.protocol.journal_spec import SuspendLevel
from gazette.protocol.trees import specs_to_yaml

log = logging.getLogger("gazette.gazctl")


class CommandError(GazetteError):
    """A command that failed for a reason the user can act on: gazctl exits 1."""


@dataclass
class Context:
    """What a command runs with: a `client` for short requests (few retries: an
    unreachable broker is reported at once), a `patient` one for appends and reads
    (rides out a broker restart), and the process's streams."""

    client: JournalClient
    patient: JournalClient
    stdin: IO[bytes] | IO[str]
    stdout: IO[bytes]
    stderr: TextIO
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def echo(self, text: str = "") -> None:
        """A line of text to stdout."""
        self.stdout.write((text + "\n").encode())
        self.stdout.flush()


def info(msg: str, **fields: Any) -> None:
    """A log line with fields (``INFO[0000] msg key=value``)."""
    log.info(msg, extra={"fields": fields})


def debug(msg: str, **fields: Any) -> None:
    """A debug line with fields (skipped cheaply unless debugging)."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug(msg, extra={"fields": fields})


def warn(msg: str, **fields: Any) -> None:
    """A warning line with fields."""
    log.warning(msg, extra={"fields": fields})


async def _selected(ctx: Context, selector: Selector) -> list[ListedJournal]:
    return (await ctx.client.list(selector)).journals


async def _all(coros: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Run concurrently; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
    except BaseExceptionGroup as eg:
        first: BaseException = eg
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


# -- list -----------------------------------------------------------------------------


def route_to_dict(route: Route) -> dict[str, Any]:
    """A route as JSON: members as ``{"zone", "suffix"}``, the primary's index."""
    return {"members": [{"zone": m.zone, "suffix": m.suffix} for m in route.members],
            "primary": route.primary, "endpoints": list(route.endpoints)}


def journal_to_dict(j: ListedJournal) -> dict[str, Any]:
    """A listed journal as ``--format json`` prints it."""
    return {"name": j.spec.name, "spec": j.spec.to_dict(), "mod_revision": j.mod_revision,
            "create_revision": j.create_revision, "route": route_to_dict(j.route)}


def journals_table(journals: Sequence[ListedJournal], *, primary: bool = False,
                   replicas: bool = False, rf: bool = False, stores: bool = False,
                   labels: Sequence[str] = ()) -> str:
    """The ``journals list`` table: NAME, then the columns asked for."""
    headers = ["NAME", *(["RF"] if rf else []), *(["PRIMARY"] if primary else []),
               *(["REPLICAS"] if replicas else []), *(["STORES"] if stores else []),
               *labels]
    rows = []
    for j in journals:
        route = j.route
        row = [j.spec.name]
        if rf:
            row.append(str(j.spec.replication))
        if primary:
            row.append(route.primary_id.suffix if route.primary_id else "")
        if replicas:
            row.append(",".join(m.suffix for i, m in enumerate(route.members)
                                if i != route.primary))
        if stores:
            row.append(",".join(j.spec.fragment.stores))
        for name in labels:
            row.append(",".join(j.spec.labels.values(name)))
        rows.append(row)
    return table(headers, rows)


async def cmd_list(ctx: Context, args: argparse.Namespace) -> int:
    journals = await _selected(ctx, args.selector)
    if args.format == "yaml":
        text = specs_to_yaml([(j.spec, j.mod_revision) for j in journals])
        ctx.stdout.write(text.encode())
        ctx.stdout.flush()
    elif args.format == "json":
        for j in journals:
            ctx.echo(json.dumps(journal_to_dict(j)))
    else:
        ctx.echo(journals_table(journals, primary=args.primary, replicas=args.replicas,
                                rf=args.rf, stores=args.stores, labels=args.label_columns))
    return 0


# -- append ----------------------------------------------------------------------------


def _reader(stream: IO[bytes] | IO[str]) -> Callable[[int], bytes]:
    """A blocking ``read(n)`` of what is available (at most n bytes) from `stream`."""
    with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
        fd = stream.fileno()
        return lambda n: os.read(fd, n)
    binary: Any = getattr(stream, "buffer", stream)
    read1 = getattr(binary, "read1", None)
    if read1 is not None:
        return lambda n: bytes(read1(n))
    return lambda n: bytes(binary.read(n))


async def _one_journal(ctx: Context, args: argparse.Namespace) -> str:
    if args.journal:
        # Fail fast (unknown journal, unreachable broker) before reading any input.
        await ctx.client.write_head(args.journal)
        return str(args.journal)
    journals = [j.spec.name for j in await _selected(ctx, args.selector)]
    sel = args.selector.format()
    if not journals:
        raise CommandError(f"no journal matches the selector {sel!r}")
    if len(journals) > 1:
        shown = ", ".join(journals[:5]) + (", ..." if len(journals) > 5 else "")
        raise CommandError(f"the selector {sel!r} matches {len(journals)} journals "
                           f"({shown}); append writes to exactly one: narrow it, e.g. "
                           f"-l name={journals[0]}")
    return journals[0]


async def cmd_append(ctx: Context, args: argparse.Namespace) -> int:
    journal = await _one_journal(ctx, args)
    if args.input == "-":
        read = _reader(ctx.stdin)
        source = "stdin"
    else:
        try:
            handle = await asyncio.to_thread(open, args.input, "rb")
        except OSError as exc:
            raise CommandError(f"cannot open {args.input}: {exc.strerror}") from None
        read, source = _reader(handle), args.input
    pump = InputPump(read)
    try:
        appended = 0
        if args.framing == "none":
            while not pump.buffer and not pump.eof:
                await pump.wait()
            pump.check()
            if pump.buffer:
                result = await ctx.patient.append(journal, pump.chunks())
                appended = result.commit.size
                debug("append response", journal=journal, begin=result.commit.begin,
                      end=result.commit.end)
        else:
            if args.framing == "fixed":
                def boundary(buf: bytearray, limit: int, start: int) -> int:
                    return fixed_boundary(buf, limit, start, at=pump.taken)
            else:
                boundary = lines_boundary
            async for batch in batches(pump, boundary, partial_ok=args.framing == "lines",
                                       max_record=args.max_record_size):
                result = await ctx.patient.append(journal, batch)
                appended += result.commit.size
                debug("append response", journal=journal, begin=result.commit.begin,
                      end=result.commit.end)
        pump.check()
    except FramingError as err:
        hint = "; --max-record-size sets it" if isinstance(err, RecordTooLong) else ""
        raise CommandError(f"{source}: {err}{hint}") from None
    except OSError as exc:
        if pump.error is exc:
            raise CommandError(f"cannot read {source}: {exc.strerror or exc}") from None
        raise
    finally:
        if args.input != "-":
            handle.close()
    debug("append finished", journal=journal, bytes=appended)
    return 0


# -- read ------------------------------------------------------------------------------


def _fragment_url(f: Fragment) -> str:
    return f"{f.backing_store.rstrip('/')}/{f.path}" if f.backing_store else ""


async def cmd_read(ctx: Context, args: argparse.Namespace) -> int:
    journals = [j.spec.name for j in await _selected(ctx, args.selector)]
    if not journals:
        warn("no journals were matched by the selector", selector=args.selector.format())
        return 0
    out = ctx.stdout

    async def one(journal: str) -> None:
        offset = -1 if args.tail else args.offset
        info("read started", journal=journal, offset=offset)
        pos = offset
        chunks = ctx.patient.read(journal, offset, block=args.block, direct=args.direct)
        try:
            async for chunk in chunks:
                frag = chunk.fragment
                debug("read is ready", **{"fragment.Begin": frag.begin,
                                          "fragment.End": frag.end,
                                          "fragment.URL": _fragment_url(frag)},
                      journal=journal, offset=chunk.offset)
                out.write(chunk.content)  # one write a chunk: never interleaved
                out.flush()
                pos = chunk.end
        finally:
            if isinstance(chunks, AsyncGenerator):
                await chunks.aclose()
        info("read finished", journal=journal, offset=pos)

    await _all([one(j) for j in journals])
    return 0


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

    await _all([one(j) for j in journals])
    return found


async def _fragments_listed(ctx: Context, journals: Sequence[str], *, begin: int = 0,
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
    listed = await _selected(ctx, args.selector)
    journals = [j.spec.name for j in listed
                if j.spec.suspend is None or j.spec.suspend.level != SuspendLevel.FULL]
    ttl = args.url_ttl or (args.signature_ttl if args.url else None)
    found = await _fragments_listed(ctx, journals, begin=args.from_, end=args.to, ttl=ttl)
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
    from gazette.fragment.store import FragmentStore, aclose_all, store_for

    listed = await _selected(ctx, args.selector)
    if not listed:
        raise CommandError(f"no journals match the selector {args.selector.format()!r}")
    with_retention = [j for j in listed if j.spec.fragment.retention > timedelta(0)]
    for j in listed:
        if j not in with_retention:
            info("journal keeps its fragments for ever (retention 0s); skipped",
                 journal=j.spec.name)
    file_root = args.file_root or ctx.env.get("BROKER_FILE_ROOT") or None
    stats = PruneStats(journals=len(with_retention))
    found = await _fragments_listed(ctx, [j.spec.name for j in with_retention])
    now = time.time()
    aged: list[FragmentInfo] = []
    for j in with_retention:
        infos = found[j.spec.name]
        stats.fragments += len(infos)
        stats.total_bytes += sum(i.fragment.size for i in infos)
        old = aged_fragments(infos, j.spec.fragment.retention, now)
        aged += old
        info("fetched aged fragments", journal=j.spec.name, total=len(infos), aged=len(old))

    stores: dict[str, FragmentStore] = {}
    if not args.dry_run:
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
            if not args.dry_run:
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
            info("would prune fragment" if args.dry_run else "pruned fragment",
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
    if pruned:
        ctx.echo(fragments_table(pruned, now=now))
    ctx.echo(stats.summary(args.dry_run))
    return 0


Command = Callable[[Context, argparse.Namespace], Awaitable[int]]
