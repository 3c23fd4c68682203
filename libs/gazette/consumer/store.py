"""Stores: where a shard keeps its application state and its checkpoint, committed
together in one transaction.

A store's `start_commit(checkpoint, wait_for)` is called when a consumer transaction
closes: it takes what the transaction changed, plus the checkpoint, and returns a future
of their atomic commit, which first waits for `wait_for` (the appends of the messages the
transaction published: their ACKs are in the checkpoint, so those appends must be durable
before it is). The next transaction runs while the commit does (the runtime never starts
a second commit before the first is done), so a store must not let that transaction's
changes leak into the commit under way. A store whose transactions would read state as
it was before the commit under way (a database's other connection) says
``pipelined = False``: the runtime then begins the next transaction once the commit is
done.

`restore_checkpoint()` is called once, before the shard's first transaction: it returns
the last committed checkpoint (empty if none) and, for stores shared between processes,
installs a fence that makes commits of any earlier holder of the shard fail.

- `MemoryStore`: state in a dict, "committed" in memory (tests, benchmarks);
- `JSONFileStore`: a JSON document in a local file, replaced atomically per commit;
  given the shard's recorded folder (`Shard.folder`), replicated by its recovery log;
- `SQLiteStore` (`gazette.consumer.sqlite`): a SQLite database on the recovery log.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, Protocol

from gazette.consumer.checkpoint import Checkpoint
from gazette.errors import GazetteError, ValidationError
from gazette.recoverylog import RecordedFolder


class StoreFenced(GazetteError):
    """Another process restored this shard's checkpoint since this store did: its
    transaction was rolled back."""


class Store(Protocol):
    """What the runtime asks of a shard's store."""

    async def restore_checkpoint(self) -> Checkpoint: ...

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]: ...

    async def close(self) -> None: ...


async def _after(wait_for: Sequence[Awaitable[Any]]) -> None:
    """Wait for every one of `wait_for`; the first failure is raised."""
    if wait_for:
        await asyncio.gather(*wait_for)


class MemoryStore:
    """`state` (a dict the application changes freely) committed in memory: a restore
    rolls `state` back to what the last commit held."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.committed: dict[str, Any] = {}
        self.checkpoint = Checkpoint()
        self.commits = 0

    async def restore_checkpoint(self) -> Checkpoint:
        self.state = dict(self.committed)
        return self.checkpoint

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        snapshot = dict(self.state)  # the next transaction changes `state` meanwhile

        async def commit() -> None:
            await _after(wait_for)
            self.committed, self.checkpoint = snapshot, checkpoint
            self.commits += 1

        return asyncio.ensure_future(commit())

    async def close(self) -> None:
        pass


class JSONFileStore:
    """`state`, a JSON-able dict, kept in a file with the checkpoint: each commit writes
    a new file and renames it over the old one, so the file always holds one whole
    commit. Given a path, the file is local (fsynced: durable across restarts on one
    host); given the shard's recorded folder, the file `name` in it is replicated by
    the recovery log (a commit is durable once its log append is)."""

    def __init__(self, where: Path | str | RecordedFolder, name: str = "state.json"
                 ) -> None:
        self.folder = where if isinstance(where, RecordedFolder) else None
        self.path = where.path(name) if isinstance(where, RecordedFolder) else Path(where)
        self.name = name
        self.state: dict[str, Any] = {}

    async def restore_checkpoint(self) -> Checkpoint:
        doc = await asyncio.to_thread(self._load)
        if doc is None:
            self.state = {}
            return Checkpoint()
        state, checkpoint = doc.get("state"), doc.get("checkpoint", "")
        if not isinstance(state, dict) or not isinstance(checkpoint, str):
            raise ValidationError(str(self.path), "not a JSONFileStore file (expected an "
                                  "object with 'state' and 'checkpoint')")
        self.state = state
        try:
            raw = base64.b64decode(checkpoint, validate=True)
        except ValueError as err:
            raise ValidationError(f"{self.path}: checkpoint", str(err)) from None
        return Checkpoint.decode(raw)

    def _load(self) -> dict[str, Any] | None:
        try:
            if self.folder is not None:
                raw = self.folder.read(self.name)
                if raw is None:
                    return None
                text = raw.decode(errors="replace")
            else:
                text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(text)
        except ValueError as err:
            raise ValidationError(str(self.path), f"not JSON: {err}") from None
        if not isinstance(doc, dict):
            raise ValidationError(str(self.path), "not a JSON object")
        return doc

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        # Encoded now: the next transaction changes `state` while this one commits.
        data = json.dumps({"state": self.state, "checkpoint": base64.b64encode(
            checkpoint.encode()).decode()}, separators=(",", ":")).encode()

        async def commit() -> None:
            await _after(wait_for)
            if self.folder is None:
                await asyncio.to_thread(self._write, data)
            else:
                await asyncio.to_thread(self.folder.replace, self.name, data)
                await self.folder.commit()

        return asyncio.ensure_future(commit())

    def _write(self, data: bytes) -> None:
        """The local file (fsynced), replaced atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def close(self) -> None:
        pass
