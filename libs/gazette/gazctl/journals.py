"""The ``gazctl journals`` verbs list, append and read; fragments and prune are in
`gazctl.fragments`, apply and edit in `gazctl.apply`."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from gazette.client import (
    ListedJournal,
    Route,
)
from gazette.fragment import Fragment
from gazette.gazctl.context import (
    CommandError,
    Context,
    debug,
    info,
    run_all,
    selected,
    stdin_reader,
    warn,
)
from gazette.gazctl.framing import (
    FramingError,
    InputPump,
    RecordTooLong,
    batches,
    fixed_boundary,
    lines_boundary,
)
from gazette.gazctl.output import table
from gazette.protocol.trees import specs_to_yaml

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
    journals = await selected(ctx, args.selector)
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


async def _one_journal(ctx: Context, args: argparse.Namespace) -> str:
    if args.journal:
        # Fail fast (unknown journal, unreachable broker) before reading any input.
        await ctx.client.write_head(args.journal)
        return str(args.journal)
    journals = [j.spec.name for j in await selected(ctx, args.selector)]
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
        read = stdin_reader(ctx.stdin)
        source = "stdin"
    else:
        try:
            handle = await asyncio.to_thread(open, args.input, "rb")
        except OSError as exc:
            raise CommandError(f"cannot open {args.input}: {exc.strerror}") from None
        read, source = stdin_reader(handle), args.input
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
    journals = [j.spec.name for j in await selected(ctx, args.selector)]
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

    await run_all([one(j) for j in journals])
    return 0
