"""What ``gazctl journals apply`` and ``gazctl shards apply`` check before applying, so a
spec that cannot work is refused with its name rather than accepted silently:

- a journal whose fragment stores no registered broker serves (brokers advertise the
  kinds of store they serve, ``store_schemes``, in their member specs in etcd: read with
  ``--etcd.address``; ``--allow-unserved-stores`` skips it);
- a shard whose source journal does not exist (asked of the broker;
  ``--allow-missing-journals`` skips it, for journals applied later).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from gazette.client import JournalClient
from gazette.errors import GazetteError, ValidationError
from gazette.gazctl.context import CommandError, Context, info
from gazette.keyspace import BROKER_ROOT, Decoder, Etcd, Layout
from gazette.labels import LabelSet, Selector
from gazette.protocol import JournalSpec, MemberSpec, ShardSpec
from gazette.protocol.trees import SpecChange

#: A check of the changes about to be applied: CommandError (nothing applied) if one
#: cannot work.
Check = Callable[[Sequence[SpecChange[Any]]], Awaitable[None]]


async def registered_brokers(address: str, prefix: str) -> list[MemberSpec]:
    """The member specs of the brokers registered in etcd under `prefix`."""
    try:
        layout = Layout.brokers(prefix)
    except ValidationError as err:
        raise CommandError(f"--etcd.prefix: {err.reason}") from None
    decode = Decoder(layout)
    try:
        async with Etcd(address) as etcd:
            kvs = (await etcd.get_prefix(layout.members)).kvs
    except (GazetteError, OSError) as err:
        raise CommandError(f"cannot read the brokers' member specs from etcd ({err}); pass "
                           "--allow-unserved-stores to apply without checking") from None
    brokers = []
    for kv in kvs:
        with contextlib.suppress(ValidationError, DecodeError):
            spec = decode(kv)
            if isinstance(spec, MemberSpec):
                brokers.append(spec)
    return brokers


def unserved_stores(spec: JournalSpec, brokers: list[MemberSpec]) -> str | None:
    """Why none of `brokers` can serve `spec`'s stores (None if one can)."""
    stores = spec.fragment.stores
    if not stores or any(b.serves_stores(stores) for b in brokers):
        return None
    schemes = sorted({url.partition(":")[0] for url in stores})
    served = sorted({s for b in brokers for s in b.store_schemes})
    missing = [s for s in schemes if s not in served] or schemes
    count = f"{len(brokers)} registered broker" + ("s serve" if len(brokers) > 1 else " serves")
    return (f"journal {spec.name}: no broker serves its {', '.join(f'{s}://' for s in missing)}"
            f" stores (the {count} {', '.join(f'{s}://' for s in served)})")


def stores_check(ctx: Context, args: argparse.Namespace) -> Check | None:
    """The stores check of ``journals apply``, if etcd's address is known and it is not
    skipped."""
    address = args.etcd_address or ctx.env.get("ETCD_ADDRESS", "")
    if args.allow_unserved_stores or not address:
        return None
    prefix = args.etcd_prefix or ctx.env.get("ETCD_PREFIX") or BROKER_ROOT

    async def check(changes: Sequence[SpecChange[Any]]) -> None:
        specs = [c.spec for c in changes
                 if isinstance(c.spec, JournalSpec) and c.spec.fragment.stores]
        if not specs:
            return
        brokers = await registered_brokers(address, prefix)
        if not brokers:
            info("no broker is registered yet: the journals' stores are not checked")
            return
        problems = [p for p in (unserved_stores(s, brokers) for s in specs) if p]
        if problems:
            raise CommandError(f"not applied: {'; '.join(problems)}; start a broker that "
                               "serves them, or pass --allow-unserved-stores")
    return check


def sources_check(client: JournalClient, args: argparse.Namespace) -> Check | None:
    """The source journals check of ``shards apply``, unless it is skipped."""
    if args.allow_missing_journals:
        return None

    async def check(changes: Sequence[SpecChange[Any]]) -> None:
        wanted = sorted({(c.name, s.journal) for c in changes
                         if isinstance(c.spec, ShardSpec) for s in c.spec.sources})
        journals = sorted({journal for _, journal in wanted})
        if not journals:
            return
        try:
            listing = await client.list(Selector(LabelSet([("name", j) for j in journals])))
        except GazetteError as err:
            raise CommandError(f"cannot check the shards' source journals at the broker "
                               f"({err}); pass --allow-missing-journals to apply without "
                               "checking") from None
        present = {j.spec.name for j in listing.journals}
        missing = [f"shard {shard}: source journal {journal} does not exist"
                   for shard, journal in wanted if journal not in present]
        if missing:
            raise CommandError(f"not applied: {'; '.join(missing)}; apply the journals "
                               "first, or pass --allow-missing-journals if they are applied "
                               "later")
    return check
