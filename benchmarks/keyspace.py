"""Keyspace and selector throughput against a real etcd (embedded, loopback).

Figures: keys/s of a KeySpace load (decoded JournalSpecs) next to the raw paged range
read it is built on; watch events/s applied by a KeySpace next to the rate the writer
could put them; selector matches/s over implicit journal labels.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import uvloop

from gazette.keyspace import Decoder, Etcd, KeySpace, Layout, encode_item
from gazette.labels import LabelSet, Selector, journal_labels
from gazette.local import EmbeddedEtcd
from gazette.protocol import JournalSpec

N_KEYS = 5000
N_WATCHED = 3000
N_MATCH = 200_000


def spec(i: int) -> JournalSpec:
    return JournalSpec(
        name=f"bench/topic-{i % 50:02d}/part-{i:05d}",
        replication=3,
        labels=LabelSet([("content-type", "application/x-ndjson"), ("region", f"r{i % 4}")]),
    )


async def put_all(etcd: Etcd, layout: Layout, specs: list[JournalSpec]) -> float:
    """Put specs with 32 in flight; returns seconds taken."""
    sem = asyncio.Semaphore(32)

    async def put(s: JournalSpec) -> None:
        async with sem:
            await etcd.put(layout.item_key(s.name), encode_item(s))

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for s in specs:
            tg.create_task(put(s))
    return time.perf_counter() - start


async def measure(endpoint: str) -> dict[str, float]:
    layout = Layout("/bench/cluster")
    async with Etcd(endpoint) as etcd:
        await put_all(etcd, layout, [spec(i) for i in range(N_KEYS)])

        start = time.perf_counter()
        raw = await etcd.get_prefix(layout.root + "/")
        raw_s = time.perf_counter() - start
        ks: KeySpace[object] = KeySpace(etcd, layout.root + "/", Decoder(layout))
        start = time.perf_counter()
        await ks.load()
        load_s = time.perf_counter() - start
        assert len(ks) == len(raw.kvs) == N_KEYS

        async with ks:
            specs = [spec(N_KEYS + i) for i in range(N_WATCHED)]
            start = time.perf_counter()
            put_s = await put_all(etcd, layout, specs)
            _, last = await etcd.get(layout.item_key(specs[-1].name))
            await ks.wait_for_revision(raw.revision + N_WATCHED, timeout=120)
            watch_s = time.perf_counter() - start
            assert last is not None and len(ks) == N_KEYS + N_WATCHED

    journals = [journal_labels(s.name, s.labels) for s in (spec(i) for i in range(1000))]
    selector = Selector.parse("prefix=bench/topic-07/, region in (r1, r3), !missing")
    start = time.perf_counter()
    matched = 0
    for i in range(N_MATCH):
        matched += selector.matches(journals[i % 1000])
    match_s = time.perf_counter() - start

    return {
        "keys": N_KEYS,
        "raw_range_keys_per_s": round(N_KEYS / raw_s),
        "keyspace_load_keys_per_s": round(N_KEYS / load_s),
        "load_vs_raw_range": round(raw_s / load_s, 3),
        "etcd_put_per_s_32_in_flight": round(N_WATCHED / put_s),
        "keyspace_watch_events_per_s": round(N_WATCHED / watch_s),
        "watch_vs_put_rate": round(put_s / watch_s, 3),
        "selector_matches_per_s": round(N_MATCH / match_s),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedEtcd(Path(tmp)) as server:
        figures = uvloop.run(measure(server.endpoint))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
