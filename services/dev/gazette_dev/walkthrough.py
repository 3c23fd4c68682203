"""The walk-through of ``gazette dev up``: the tutorial's first steps through the first
broker's HTTP gateway and the gRPC API (specs, label selections, appends, a fragment
persisted and listed), then an append replicated to every broker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TextIO

import aiohttp
import grpc

from gazette.fragment import fragment_from_pb
from gazette.keyspace import TxnConflict, apply_changes
from gazette.labels import Selector, journal_labels
from gazette.local import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import JournalSpec, SpecChange, journal_changes_from_yaml, specs_to_yaml
from gazette_broker.server import BrokerServer

JOURNAL = "example/journal"
HELLO = b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'


#: A journal copied on every broker of the local cluster.
REPLICATED_YAML = """
name: example/replicated
replication: 3
labels:
  - name: content-type
    value: application/x-ndjson
fragment:
  stores: ["file:///"]
"""


async def tutorial(servers: list[BrokerServer], out: TextIO) -> None:
    """The tutorial's first steps, through the first broker's HTTP gateway and the gRPC
    API, then an append replicated to every broker."""
    server = servers[0]
    changes = journal_changes_from_yaml(TUTORIAL_JOURNALS_YAML)
    current = {c.name: server.keyspace.get(server.layout.item_key(c.name)) for c in changes}
    yaml_text = TUTORIAL_JOURNALS_YAML
    if any(current.values()):  # a kept data dir: the journals exist already
        print("\nThe tutorial's journals exist already (kept data dir).", file=out)
    else:
        revision = await server.apply_yaml(yaml_text)
        print(f"\n$ gazctl journals apply  # the tutorial's journals\n"
              f"applied {len(changes)} journals at revision {revision}", file=out)
    await server.wait_routed({c.name for c in changes})
    await specs_and_selections(server, {c.name for c in changes}, out)

    url = f"{server.http_url}/{JOURNAL}"
    async with aiohttp.ClientSession() as http:
        print(f"\n$ curl -X PUT --data-binary @- {url}", file=out)
        async with http.put(url, data=HELLO) as r:
            r.raise_for_status()
            print(f"commit [{r.headers['X-Gazette-Commit-Begin']}, "
                  f"{r.headers['X-Gazette-Commit-End']})", file=out)
        async with http.get(url) as r:
            body = await r.read()
        print(f"\n$ curl {url}\n{body.decode(errors='replace')}", end="", file=out)
        async with http.get(url + "?offset=16") as r:
            partial = await r.read()
        print(f"\n$ curl \"{url}?offset=16\"\n{partial.decode(errors='replace')}", end="",
              file=out)

        async def race(n: int) -> None:
            data = b'{"Msg": "Race!", "N": %d}\n' % n
            async with http.put(url, data=data) as r:
                r.raise_for_status()

        await asyncio.gather(*(race(n) for n in range(1, 21)))
        async with http.get(url) as r:
            lines = (await r.read()).splitlines()
        parsed = [json.loads(line) for line in lines]  # raises if any append interleaved
        races = sorted(m["N"] for m in parsed if m.get("Msg") == "Race!")
        print(f"\n20 concurrent PUTs: the journal holds {len(parsed)} whole JSON lines; "
              f"every race 1-20 landed intact: {set(races) == set(range(1, 21))}", file=out)

    holder = next(s for s in servers if JOURNAL in s.broker.replicas
                  and s.broker.replicas[JOURNAL].is_primary)
    await holder.broker.replicas[JOURNAL].roll()
    await asyncio.wait_for(holder.broker.persister.wait_idle(), 30)
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        page = await broker_pb2_grpc.JournalStub(channel).ListFragments(
            pb.FragmentsRequest(journal=JOURNAL))
    print(f"\n$ gazctl journals fragments -l name={JOURNAL}", file=out)
    print(f"{'OFFSET':>8} {'LENGTH':>8}  {'PERSISTED':9}  {'SHA1':14} COMPRESSION", file=out)
    for item in page.fragments:
        frag = fragment_from_pb(item.spec)
        print(f"{frag.begin:>8} {frag.size:>6} B  {'yes' if frag.backing_store else '':9}  "
              f"{frag.sha1.hex()[:12]}.. {frag.codec.value}", file=out)
    stored = sorted(p.relative_to(server.config.file_root or Path("."))
                    for p in (server.config.file_root or Path(".")).rglob("*.sz"))
    print("\n$ ls -R fragment-store/\n" + "\n".join(f"  {p}" for p in stored), file=out)
    if len(servers) >= 3:
        await replicated(servers, out)


async def specs_and_selections(server: BrokerServer, names: set[str], out: TextIO) -> None:
    """The specs as ``gazctl journals list --format yaml`` folds them, the tutorial's
    label selections, and a stale edit refused (optimistic concurrency)."""
    journals = [(e.value, e.mod_revision) for e in server.keyspace.prefixed(server.layout.items)
                if isinstance(e.value, JournalSpec) and e.value.name in names]
    print("\n$ gazctl journals list --format yaml  # folded into the smallest tree", file=out)
    print(specs_to_yaml(journals).rstrip(), file=out)
    print("\n$ gazctl journals list -l SELECTOR  # selecting journals by label", file=out)
    for text, _ in TUTORIAL_SELECTIONS:
        selector = Selector.parse(text)
        selected = [spec.name for spec, _ in journals
                    if selector.matches(journal_labels(spec.name, spec.labels))]
        print(f"  -l {text!r:48} -> {', '.join(selected) or '(none)'}", file=out)
    spec, seen = next((s, r) for s, r in journals if s.name == JOURNAL)
    edit = [SpecChange(spec.name, seen, spec)]
    await apply_changes(server.etcd, server.layout, edit)
    try:
        await apply_changes(server.etcd, server.layout, edit)
    except TxnConflict as err:
        print(f"\nA second edit of {spec.name} at its old revision is refused:\n  {err}",
              file=out)


async def replicated(servers: list[BrokerServer], out: TextIO) -> None:
    """An append to a journal of replication 3: every broker holds the same bytes."""
    name = "example/replicated"
    if servers[0].keyspace.get(servers[0].layout.item_key(name)) is None:
        await servers[0].apply_yaml(REPLICATED_YAML)
    else:
        await servers[0].wait_routed({name})
    url = f"{servers[0].http_url}/{name}"
    async with aiohttp.ClientSession() as http, \
            http.put(url, data=b'{"Msg": "Copied three times"}\n') as r:
        r.raise_for_status()
    res = servers[0].broker.resolver.resolve(name)  # type: ignore[union-attr]
    print(f"\n$ curl -X PUT ... {url}\n{name} (replication 3) is on "
          f"{', '.join(str(m) for m in res.route.members)}; primary {res.route.primary_id}",
          file=out)
    for server in servers:
        replica = server.broker.replicas.get(name)
        if replica is not None:
            print(f"  {server.id}: write head {replica.write_head}, open fragment "
                  f"[{replica.spool.begin}, {replica.spool.end}) sha1 "
                  f"{replica.spool.fragment.sha1.hex()[:12]}..", file=out)
