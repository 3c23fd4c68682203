"""The ``apply`` and ``edit`` verbs of ``gazctl journals`` and ``gazctl shards``: YAML spec
trees into revision-guarded Applies, in batches of at most ``--max-txn-size`` changes (one
etcd transaction holds at most 128 operations), as Go gazctl's ``--max-txn-size`` does.
Each batch is atomic; the whole is not, so a failed batch is reported with what was
applied before it. A `SpecKind` is what differs between journals and shards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from gazette.client import Applied, ApplyConflict, JournalClient
from gazette.errors import GazetteError, ValidationError
from gazette.gazctl.checks import Check, stores_check
from gazette.gazctl.config import MAX_TXN_SIZE
from gazette.gazctl.context import CommandError, Context, info, stdin_reader, warn
from gazette.gazctl.framing import InputPump
from gazette.labels import LabelSet, Selector
from gazette.protocol import JournalSpec, ShardSpec
from gazette.protocol.trees import SpecChange, journal_changes_from_yaml, specs_to_yaml

S = TypeVar("S", JournalSpec, ShardSpec)
Changes = Sequence[SpecChange[Any]]


@dataclass(frozen=True)
class SpecKind(Generic[S]):
    """What applying and editing one kind of spec takes: its name for messages (`item`,
    e.g. "journal"), the `server` that applies it, the implicit `label` naming one,
    how to `parse` YAML, `apply` changes, and list the `current` specs with their mod
    revisions (for edits, and for saying which revision was stale); `check`: what
    ``apply`` checks first (`gazette.gazctl.checks`), if anything."""

    item: str
    server: str
    label: str
    parse: Callable[[str], list[SpecChange[S]]]
    apply: Callable[[Sequence[SpecChange[S]]], Awaitable[Applied]]
    current: Callable[[Selector], Awaitable[list[tuple[S, int]]]]
    check: Check | None = None

    @property
    def noun(self) -> str:
        return f"{self.item}s"

    @property
    def retry_hint(self) -> str:
        return f"list the {self.noun} again and re-apply your changes"


def journal_kind(client: JournalClient, check: Check | None = None
                 ) -> SpecKind[JournalSpec]:
    """Journals, through a broker's `client`; `check` before applying."""
    async def current(selector: Selector) -> list[tuple[JournalSpec, int]]:
        return [(j.spec, j.mod_revision) for j in (await client.list(selector)).journals]

    return SpecKind("journal", "broker", "name", journal_changes_from_yaml, client.apply,
                    current, check)


def spec_name(spec: JournalSpec | ShardSpec) -> str:
    return spec.name if isinstance(spec, JournalSpec) else spec.id


def parse_specs(kind: SpecKind[S], text: str, source: str) -> list[SpecChange[S]]:
    """Changes from apply-style YAML; CommandError naming `source` and the field."""
    try:
        changes = kind.parse(text)
    except ValidationError as err:
        raise CommandError(f"{source}: invalid {kind.item} specs: {err}") from None
    if not changes:
        raise CommandError(f"{source}: no {kind.item} specs found")
    return changes


async def stale_changes(kind: SpecKind[S], changes: Changes, err: ApplyConflict) -> str:
    """Which changes were stale, and why, as one clause."""
    wanted = Selector(LabelSet([(kind.label, c.name) for c in changes]))
    try:
        now = {spec_name(spec): rev for spec, rev in await kind.current(wanted)}
    except GazetteError:
        now = None
    stale = []
    for c in changes:
        current = None if now is None else now.get(c.name, 0)
        if current is None or current == c.revision:
            continue
        if c.revision == 0:
            stale.append(f"{c.name} already exists (at revision {current}; give its "
                         "revision: to change it)")
        elif current == 0:
            stale.append(f"{c.name} no longer exists (it was at revision {c.revision})")
        else:
            stale.append(f"the spec of {c.name} changed since revision {c.revision} "
                         f"(it is now at revision {current})")
    if not stale:
        return f"a spec changed since it was read (etcd is at revision {err.revision})"
    return "; ".join(stale)


class _Stale(CommandError):
    """A batch not applied because a revision in it was stale (the message says which)."""


async def _apply_batch(kind: SpecKind[S], batch: Sequence[SpecChange[S]]) -> int:
    """One Apply; its revision. CommandError saying why it was refused, as a clause
    (the caller knows what else was or was not applied)."""
    try:
        applied = await kind.apply(batch)
    except ApplyConflict as err:
        raise _Stale(await stale_changes(kind, batch, err)) from None
    except ValidationError as err:
        raise CommandError(f"the {kind.server} refused the specs: {err}") from None
    for warning in applied.warnings:
        warn(warning)
    return applied.revision


def _span(changes: Changes, lo: int, hi: int) -> str:
    """Changes ``lo..hi-1`` by their place in the input and first and last names."""
    if hi - lo == 1:
        return f"change {lo + 1}: {changes[lo].name}"
    return f"changes {lo + 1}-{hi}: {changes[lo].name} to {changes[hi - 1].name}"


def _batches(first: int, last: int) -> str:
    return f"batch {first}" if first == last else f"batches {first}-{last}"


def _applied(changes: Changes, done: int, size: int, revision: int) -> str:
    """The first `done` changes (whole batches of `size`), applied up to `revision`."""
    verb = "was" if done <= size else "were"
    return (f"{_batches(1, done // size)} {verb} applied ({_span(changes, 0, done)}; "
            f"revision {revision})")


def partial_failure(changes: Changes, size: int, failed: int, reason: str,
                    revision: int, *, uncertain: bool = False, noun: str = "journals") -> str:
    """One line on a failed batch (index `failed`) of many: why, which batches (and so
    which `noun`, by their place in the input) were applied, and which were not.
    `uncertain`: the server was not reached in the end, so the failed batch itself may
    have been applied."""
    count = -(-len(changes) // size)
    done, after = failed * size, min((failed + 1) * size, len(changes))
    this = f"batch {failed + 1} of {count}"
    if not uncertain:
        parts = [f"{this} was not applied: {reason}",
                 _applied(changes, done, size, revision) if done else "no batch was applied"]
        if not done:
            return "; ".join([*parts, f"list the {noun} again and re-apply your changes"])
        after = done  # the failed batch is among those not applied
    else:
        parts = [f"{this} failed and may or may not have been applied: {reason}",
                 _applied(changes, done, size, revision) if done else
                 "no batch before it was applied", f"it held {_span(changes, done, after)}"]
    if after < len(changes):
        parts.append(f"not applied: {_batches(after // size + 1, count)} "
                     f"({_span(changes, after, len(changes))})")
    return "; ".join([*parts, f"list the {noun} again and re-apply those"])


async def apply_changes(kind: SpecKind[S], changes: Sequence[SpecChange[S]],
                        max_txn_size: int = MAX_TXN_SIZE) -> int:
    """Apply in batches of at most `max_txn_size` changes, each its own Apply with the
    revision guards of its changes; the last revision. CommandError (one line) if a
    revision was stale or the server refused a spec, naming what was applied before."""
    if not 1 <= max_txn_size <= MAX_TXN_SIZE:
        raise CommandError(f"max_txn_size: must be 1 to {MAX_TXN_SIZE}, got {max_txn_size}")
    count = -(-len(changes) // max_txn_size)
    if count == 1:
        try:
            revision = await _apply_batch(kind, changes)
        except _Stale as err:
            raise CommandError(f"not applied: {err}; {kind.retry_hint}") from None
        info("successfully applied", revision=revision)
        return revision
    warn(f"applying {len(changes)} changes in {count} batches of at most {max_txn_size}; "
         "each batch is atomic, the whole is not")
    revision = 0
    for n in range(count):
        batch = changes[n * max_txn_size:(n + 1) * max_txn_size]
        try:
            revision = await _apply_batch(kind, batch)
        except CommandError as err:  # stale or refused: nothing of the batch applied
            raise CommandError(partial_failure(changes, max_txn_size, n, str(err),
                                               revision, noun=kind.noun)) from None
        except GazetteError as err:  # unreachable: an attempt may have been applied
            raise CommandError(partial_failure(changes, max_txn_size, n, str(err), revision,
                                               uncertain=True, noun=kind.noun)) from None
        info("applied batch", batch=f"{n + 1}/{count}", changes=len(batch),
             revision=revision)
    info("successfully applied", revision=revision)
    return revision


async def read_input(ctx: Context, file: str) -> tuple[str, str]:
    """The text of `file` ('-': stdin) and what to call it in messages."""
    if file == "-":
        source = "stdin"
        # In a daemon thread: Ctrl-C while waiting on a terminal must not hang the exit.
        data = b"".join([chunk async for chunk in InputPump(stdin_reader(ctx.stdin)).chunks()])
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            raise CommandError(f"stdin is not UTF-8 text: {exc}") from None
    else:
        source = file
        try:
            text = await asyncio.to_thread(Path(file).read_text, encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {file}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
    return text, source


async def apply_specs(ctx: Context, args: argparse.Namespace, kind: SpecKind[S]) -> int:
    """``apply``: the changes of ``-f``'s YAML (``--dry-run``: only shown)."""
    changes = parse_specs(kind, *await read_input(ctx, args.file))
    if args.dry_run:
        for c in changes:
            action = "delete" if c.is_delete else "upsert"
            expect = f"at revision {c.revision}" if c.revision else "new"
            ctx.echo(f"{action} {c.name} ({expect})")
        count = -(-len(changes) // args.max_txn_size)
        info("dry run: nothing was applied", changes=len(changes),
             **({"batches": count} if count > 1 else {}))
        return 0
    if kind.check is not None:
        await kind.check(changes)
    await apply_changes(kind, changes, args.max_txn_size)
    return 0


async def cmd_apply(ctx: Context, args: argparse.Namespace) -> int:
    return await apply_specs(ctx, args, journal_kind(ctx.client, stores_check(ctx, args)))


EDIT_HEADER = """\
# Edit the {item} specs below, then save and quit: they are applied in one transaction
# (in batches if there are more than --max-txn-size), each only if it is still at its
# revision. Lines beginning with '#' are ignored; an unchanged or empty file applies
# nothing.
"""


def _meaningful(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines()
                     if line.strip() and not line.lstrip().startswith("#"))


def run_editor(editor: str, path: str) -> int:
    """Run ``$EDITOR "$path"`` through the shell (so ``EDITOR="code --wait"`` or
    ``EDITOR="sed -i s/a/b/"`` work); its exit status."""
    return subprocess.run(f"{editor} {shlex.quote(path)}", shell=True, check=False).returncode


async def edit_specs(ctx: Context, args: argparse.Namespace, kind: SpecKind[S]) -> int:
    """``edit``: the selected specs through $EDITOR, then applied with revision guards."""
    specs = await kind.current(args.selector)
    if not specs:
        raise CommandError(f"no {kind.noun} match the selector {args.selector.format()!r}")
    original = EDIT_HEADER.format(item=kind.item) + specs_to_yaml(specs)
    fd, path = tempfile.mkstemp(prefix=f"gazctl-{kind.noun}-edit-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(original)
    editor = ctx.env.get("EDITOR") or "vi"
    status = await asyncio.to_thread(run_editor, editor, path)
    if status != 0:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise CommandError(f"the editor ({editor}) exited with status {status}; nothing "
                           "was applied")
    try:
        edited = await asyncio.to_thread(Path(path).read_text, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read the edited specs {path}: {exc}") from None
    if not _meaningful(edited) or _meaningful(edited) == _meaningful(original):
        with contextlib.suppress(OSError):
            os.unlink(path)
        ctx.stderr.write("Edit cancelled, no changes made.\n")
        return 0
    try:
        await apply_changes(kind, parse_specs(kind, edited, "edited specs"),
                            args.max_txn_size)
    except CommandError as err:
        raise CommandError(f"{err} (your edit is kept in {path})") from None
    with contextlib.suppress(OSError):
        os.unlink(path)
    return 0


async def cmd_edit(ctx: Context, args: argparse.Namespace) -> int:
    return await edit_specs(ctx, args, journal_kind(ctx.client))
