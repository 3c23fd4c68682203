"""What every ``gazctl journals`` verb shares: the `Context` a command runs with,
`CommandError` (exit 1), log lines with fields, and small helpers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TextIO

from gazette.client import (
    JournalClient,
    ListedJournal,
)
from gazette.errors import GazetteError
from gazette.labels import Selector

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


async def selected(ctx: Context, selector: Selector) -> list[ListedJournal]:
    return (await ctx.client.list(selector)).journals


async def run_all(coros: Sequence[Coroutine[Any, Any, None]]) -> None:
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


def stdin_reader(stream: IO[bytes] | IO[str]) -> Callable[[int], bytes]:
    """A blocking ``read(n)`` of what is available (at most n bytes) from `stream`."""
    with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
        fd = stream.fileno()
        return lambda n: os.read(fd, n)
    binary: Any = getattr(stream, "buffer", stream)
    read1 = getattr(binary, "read1", None)
    if read1 is not None:
        return lambda n: bytes(read1(n))
    return lambda n: bytes(binary.read(n))


#: A verb: runs with the context and its parsed arguments, returns the exit status.
Command = Callable[[Context, argparse.Namespace], Awaitable[int]]
