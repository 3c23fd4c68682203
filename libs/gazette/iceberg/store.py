"""A consumer shard's store whose state is an Iceberg table: each transaction's rows are
appended as one snapshot, and the shard's checkpoint is committed with them, in the
same catalog commit, so a crash never writes a row twice or drops one.

The checkpoint is a table property (``gazette.checkpoint.<shard>``, base64 of the
checkpoint's protobuf), set by the transaction that appends the snapshot; the snapshot's
summary names the shard and the offsets read through, for whoever looks. A table
property, not only the snapshot's summary, because snapshots are expired and compacted
away and a shard may be idle for longer than they live.

Fencing. `restore_checkpoint` moves the shard's fence (``gazette.fence.<shard>``) in a
commit of its own, so any earlier holder of the shard (a zombie that has not noticed it
lost its lease) can no longer commit: a commit first checks, on the table as this store
last saw it, that the fence is still its own, and the catalog refuses a commit whose
base snapshot is no longer the table's (pyiceberg's ``AssertRefSnapshotId``). Every
change to a fence or a checkpoint comes with a new snapshot (the fence's, an empty
append), so no change to either can slip between the check and the commit. When another
shard committed first, the store reloads the table, checks its fence again and retries
(pyiceberg's own retries are off: they would re-apply the commit to whatever the table
became, fence or not).

pyiceberg blocks (SQL, files, S3): each store runs it on a thread of its own, every call
under a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from gazette.consumer.checkpoint import Checkpoint
from gazette.consumer.store import StoreFenced
from gazette.errors import ValidationError
from gazette.iceberg import metrics
from gazette.iceberg.catalog import CONFLICTS, TableConfig, ensure_table, retrying
from gazette.iceberg.schema import Rows, TableSchema

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds a restore or a commit may take, conflicts with other shards' commits and
#: retries included.
DEADLINE = 60.0
FENCE, CHECKPOINT = "gazette.fence.", "gazette.checkpoint."


class IcebergStore:
    """The store of shard `shard` (its id) appending to the table of `config`:
    `rows` gathers the open transaction's rows (`Rows.add`). Transactions are
    pipelined: a commit takes the rows it commits, and the next transaction fills new
    ones."""

    pipelined = True

    def __init__(self, config: TableConfig, schema: TableSchema, shard: str, *,
                 catalog: Callable[[], Catalog] | None = None, deadline: float = DEADLINE
                 ) -> None:
        if not shard:
            raise ValidationError("shard", "must not be empty")
        self.config, self.schema, self.shard = config, schema, shard
        self.deadline = deadline
        self.rows = Rows(schema)
        self.fence = 0
        self._catalog = catalog
        self._table: Table | None = None
        self._arrow: pa.Schema | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"iceberg-{shard}")

    @property
    def table(self) -> Table:
        if self._table is None:
            raise RuntimeError("IcebergStore: restore_checkpoint() first")
        return self._table

    async def _run(self, fn: Callable[[], T]) -> T:
        """`fn()` on this store's thread, waited for no longer than the deadline (a
        commit that lands after it is fenced or read back by the next restore)."""
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._thread, fn),
                                      self.deadline + 5)

    async def restore_checkpoint(self) -> Checkpoint:
        """Open (or make) the table, move this shard's fence, and return its last
        committed checkpoint."""
        return await self._run(self._restore)

    def _restore(self) -> Checkpoint:
        deadline = time.monotonic() + self.deadline
        catalog = self._catalog() if self._catalog is not None else self.config.catalog()
        table = ensure_table(catalog, self.config, self.schema, deadline)
        arrow = self._arrow = table.schema().as_arrow()

        def move_fence() -> int:
            table.refresh()
            fence = int(table.properties.get(FENCE + self.shard, "0")) + 1
            with table.transaction() as tx:
                tx.append(arrow.empty_table(), snapshot_properties={
                    "gazette.shard": self.shard, "gazette.fence": str(fence)})
                tx.set_properties({FENCE + self.shard: str(fence)})
            return fence

        self.fence = retrying(move_fence, deadline, f"shard {self.shard}: fence")
        self._table = table
        self.rows = Rows(self.schema)
        raw = table.properties.get(CHECKPOINT + self.shard)
        checkpoint = Checkpoint.decode(base64.b64decode(raw)) if raw else Checkpoint()
        log.info("shard %s: table %s restored (fence %d, %d journals in the checkpoint)",
                 self.shard, self.config.identifier, self.fence, len(checkpoint.sources))
        return checkpoint

    def start_commit(self, checkpoint: Checkpoint, wait_for: Sequence[Awaitable[Any]]
                     ) -> asyncio.Future[None]:
        """Append the open transaction's rows with `checkpoint`, once `wait_for` are
        done."""
        rows, self.rows = self.rows, Rows(self.schema)
        data = base64.b64encode(checkpoint.encode()).decode()
        summary = {"gazette.shard": self.shard, "gazette.offsets": ",".join(
            f"{j}:{o}" for j, o in sorted(checkpoint.sources.items()))[:4000]}

        async def commit() -> None:
            if wait_for:
                await asyncio.gather(*wait_for)
            started = time.monotonic()
            await self._run(lambda: self._commit(rows, data, summary))
            metrics.COMMIT_SECONDS.observe(time.monotonic() - started)
            metrics.ROWS.inc(len(rows))
            if rows.bad:
                metrics.BAD_VALUES.inc(rows.bad)

        return asyncio.ensure_future(commit())

    def _commit(self, rows: Rows, checkpoint: str, summary: dict[str, str]) -> None:
        table, arrow = self.table, self._arrow
        assert arrow is not None
        frame = rows.table(arrow)
        deadline = time.monotonic() + self.deadline

        def attempt() -> None:
            fence = table.properties.get(FENCE + self.shard)
            if fence != str(self.fence):
                metrics.FENCED.inc()
                raise StoreFenced(
                    f"shard {self.shard}: table {self.config.identifier} was restored by "
                    f"another process since this one (fence {fence}, this one's "
                    f"{self.fence}): the transaction is not committed")
            try:
                with table.transaction() as tx:
                    tx.append(frame, snapshot_properties=summary)
                    tx.set_properties({CHECKPOINT + self.shard: checkpoint})
            except CONFLICTS:
                metrics.CONFLICTS.inc()
                table.refresh()
                raise

        retrying(attempt, deadline, f"shard {self.shard}: commit")

    async def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
