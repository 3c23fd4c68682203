"""What the examples' ``setup`` commands share: their ndjson journals and their shards,
each made where missing (so ``setup`` can run again, or beside a running example)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gazette.client import JournalClient
from gazette.keyspace import Etcd, Layout, apply_changes
from gazette.protocol import ShardSpec, SpecChange, journal_changes_from_yaml

NDJSON = "application/x-ndjson"


async def ensure_journals(client: JournalClient, prefix: str, journals: Sequence[str], *,
                          replication: int = 1, fragment_store: str = "file:///",
                          content_type: str = NDJSON) -> None:
    """Make the `journals` (ndjson, unless said) under `prefix` that do not exist yet."""
    children = "".join(f"  - name: {j}\n" for j in journals)
    changes = journal_changes_from_yaml(
        f"name: {prefix}\nreplication: {replication}\nlabels: [{{name: content-type, "
        f"value: {content_type}}}]\nfragment: {{stores: [{json.dumps(fragment_store)}]}}\n"
        f"children:\n{children}")
    existing = {j.spec.name for j in (await client.list(f"prefix={prefix}")).journals}
    if missing := [c for c in changes if c.name not in existing]:
        await client.apply(missing)


async def ensure_shards(etcd: Etcd, layout: Layout, shards: Sequence[ShardSpec]) -> None:
    """Make the `shards` of the application at `layout` that do not exist yet."""
    changes = [SpecChange(s.id, 0, s) for s in shards
               if (await etcd.get(layout.item_key(s.id)))[1] is None]
    if changes:
        await apply_changes(etcd, layout, changes)
