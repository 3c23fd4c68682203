"""Word count, after Gazette's example: two stages in one application, and a query API.

Lines ``{"text": "..."}`` (ndjson) are appended to ``examples/word-count/lines``. The
shard ``word-count/split`` reads them and, per transaction, publishes one delta
``{"word", "n"}`` per distinct word to ``examples/word-count/deltas/part-NNN`` (the
partition picked by the word's hash). Shards ``word-count/count-NNN`` (one per deltas
journal) add the deltas to the counts in their store, so each word is counted by exactly
one shard: the one that answers for it.

The query API: the gRPC method ``/gazette.examples.WordCount/Count`` (JSON request
``{"word": w}``, answer ``{"word", "count", "shard"}``) and ``GET /word-count/{word}`` on
a member's HTTP port. Any member answers: the request goes to the counting shard's
primary (`gazette.consumer.AppServices`).

Run it with ``gazette-consumer serve --app gazette_consumer.examples.word_count:WordCount
--app-name word-count``; ``python -m gazette_consumer.examples.word_count setup``
creates the journals and shards, ``publish`` appends lines, ``query WORD`` asks a count.
The store is a `JSONFileStore` per shard in ``$WORD_COUNT_DIR`` if set, else in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import uvloop
from aiohttp import web

from gazette.auth import PLAIN, auth_for, open_channel
from gazette.client import AppendQueue, JournalClient
from gazette.client.wire import parse_address
from gazette.consumer import (
    Application,
    AppServices,
    JSONFileStore,
    MemoryStore,
    NoShardPrimary,
    Shard,
    Store,
)
from gazette.errors import ValidationError
from gazette.keyspace import CONSUMER_ROOT, Etcd, Layout
from gazette.message import Envelope, JsonMessage, Partition, Publisher, fnv1a_32
from gazette.protocol import ShardSource, ShardSpec
from gazette_consumer.examples.setup import ensure_journals, ensure_shards

APP = "word-count"
PREFIX = "examples/word-count"
LINES = f"{PREFIX}/lines"
DELTAS = f"{PREFIX}/deltas/"
PARTS = 4
NDJSON = "application/x-ndjson"
SERVICE, METHOD = "gazette.examples.WordCount", "Count"
COUNT_PATH = f"/{SERVICE}/{METHOD}"
SPLIT_SHARD = f"{APP}/split"
_WORD = re.compile(r"[\w']+")
MAX_WORD = 256


def delta_partition(msg: JsonMessage) -> Partition:
    """The deltas journal of a delta message: by its word."""
    return Partition(f"{DELTAS}part-{fnv1a_32(msg['word'].encode()) % PARTS:03d}", NDJSON)


def count_shard(word: str) -> str:
    """The shard that counts `word`."""
    return f"{APP}/count-{fnv1a_32(word.encode()) % PARTS:03d}"


def words(text: str) -> list[str]:
    return [w[:MAX_WORD] for w in _WORD.findall(text.lower())]


def parse_query(request: bytes) -> str:
    """The word of a ``{"word": w}`` request; `ValidationError` naming what is wrong."""
    try:
        word = json.loads(request).get("word")
    except (ValueError, AttributeError):
        raise ValidationError("request", "expected a JSON object {\"word\": ...}") from None
    if not isinstance(word, str) or not words(word):
        raise ValidationError("word", f"expected a word, got {word!r}")
    return words(word)[0]


class WordCount(Application):
    """Splits lines into word deltas (shard ``word-count/split``) and counts them
    (``word-count/count-NNN``)."""

    def __init__(self, directory: Path | str | None = None) -> None:
        folder = directory if directory is not None else os.environ.get("WORD_COUNT_DIR")
        self.directory = Path(folder) if folder else None

    def new_store(self, shard: Shard) -> Store:
        if self.directory is None:
            return MemoryStore()
        self.directory.mkdir(parents=True, exist_ok=True)
        return JSONFileStore(self.directory / f"{shard.id.replace('/', '_')}.json")

    def txn_state(self, shard: Shard) -> Counter[str]:
        """The words of the open transaction (split shard)."""
        return Counter()

    def consume_message(self, shard: Shard, store: Any, envelope: Envelope,
                        publisher: Publisher) -> None:
        msg = envelope.message
        if envelope.journal.startswith(DELTAS):
            word, n = msg.get("word"), msg.get("n")
            if isinstance(word, str) and isinstance(n, int):
                store.state[word] = store.state.get(word, 0) + n
        elif isinstance(text := msg.get("text"), str):
            shard.txn.update(words(text))

    def finalize_txn(self, shard: Shard, store: Any, publisher: Publisher) -> None:
        for word, n in shard.txn.items():
            publisher.publish_uncommitted(delta_partition, JsonMessage(word=word, n=n))

    def register(self, services: AppServices) -> None:
        async def count(shard: Shard, store: Any, request: bytes) -> bytes:
            word = parse_query(request)
            return json.dumps({"word": word, "count": store.state.get(word, 0),
                               "shard": shard.id}).encode()

        services.add_shard_method(SERVICE, METHOD, count,
                                  lambda request: count_shard(parse_query(request)))
        if services.http is not None:
            async def http_count(request: web.Request) -> web.Response:
                query = json.dumps({"word": request.match_info["word"]}).encode()
                try:
                    answer = await services.call(COUNT_PATH, query)
                except ValidationError as err:
                    return web.json_response({"error": str(err)}, status=400)
                except (NoShardPrimary, grpc.aio.AioRpcError) as err:  # none now, or it failed
                    return web.json_response({"error": str(err)}, status=503)
                # (A refusal of the caller's token is the member's: 401 or 403.)
                return web.Response(body=answer, content_type="application/json")

            services.http.router.add_get("/word-count/{word}", http_count)


def shard_specs() -> list[ShardSpec]:
    return [ShardSpec(SPLIT_SHARD, (ShardSource(LINES),)), *(
        ShardSpec(f"{APP}/count-{i:03d}", (ShardSource(f"{DELTAS}part-{i:03d}"),))
        for i in range(PARTS))]


async def setup(client: JournalClient, etcd: Etcd, *, fragment_store: str = "file:///",
                app_name: str = APP, etcd_root: str = CONSUMER_ROOT) -> None:
    """Make the journals and the shards, where missing."""
    await ensure_journals(client, f"{PREFIX}/",
                          [LINES, *(f"{DELTAS}part-{i:03d}" for i in range(PARTS))],
                          fragment_store=fragment_store)
    await ensure_shards(etcd, Layout.consumer_app(app_name, etcd_root), shard_specs())


async def publish(client: JournalClient, lines: Sequence[str]) -> int:
    """Append `lines` (committed at once); returns the write head of the lines journal."""
    async with AppendQueue(client) as queue:
        publisher = Publisher(queue)
        to_lines = Partition(LINES, NDJSON)
        await asyncio.gather(*(publisher.publish_committed(lambda _: to_lines,
                                                           JsonMessage(text=line))
                               for line in lines))
    return await client.write_head(LINES)


async def query(address: str, word: str, timeout: float = 10.0) -> dict[str, Any]:
    """Ask any member of the application for `word`'s count (over TLS when `address`
    is https://, with the system's CAs). A shard between primaries (starting, or
    handed to another member) answers UNAVAILABLE: asked again, with backoff, until
    `timeout`."""
    auth = auth_for(address, PLAIN)
    deadline = asyncio.get_running_loop().time() + timeout
    backoff = 0.05
    async with open_channel(parse_address(address), [], auth) as channel:
        call = channel.unary_unary(COUNT_PATH, request_serializer=None,
                                   response_deserializer=None)
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                answer = await call(json.dumps({"word": word}).encode(),
                                    timeout=max(left, 0.01))
                break
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or left <= backoff:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
    result: dict[str, Any] = json.loads(answer)
    return result


async def _main(args: argparse.Namespace) -> int:
    if args.command == "query":
        print(json.dumps(await query(args.consumer_address, args.word)))
        return 0
    async with JournalClient(args.broker_address) as client:
        if args.command == "setup":
            etcd = Etcd(args.etcd_address)
            await etcd.connect()
            try:
                await setup(client, etcd, fragment_store=args.fragment_store,
                            etcd_root=args.etcd_prefix)
            finally:
                await etcd.close()
            print(f"journals {LINES}, {DELTAS}part-000..{PARTS - 1:03d} and "
                  f"{PARTS + 1} shards of app {APP} are there")
        else:
            lines = args.lines or [line.rstrip("\n") for line in sys.stdin]
            head = await publish(client, lines)
            print(f"appended {len(lines)} lines; {LINES} is at offset {head}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gazette_consumer.examples.word_count",
                                     description="Word count: set up, publish, query.")
    parser.add_argument("--broker.address", dest="broker_address",
                        default=os.environ.get("BROKER_ADDRESS", "localhost:8080"))
    parser.add_argument("--consumer.address", dest="consumer_address",
                        default=os.environ.get("CONSUMER_ADDRESS", "localhost:8090"))
    parser.add_argument("--etcd.address", dest="etcd_address",
                        default=os.environ.get("ETCD_ADDRESS", "http://localhost:2379"))
    parser.add_argument("--etcd.prefix", dest="etcd_prefix",
                        default=os.environ.get("CONSUMER_ETCD_PREFIX", CONSUMER_ROOT))
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("setup", help="create the journals and shards (where missing)")
    make.add_argument("--fragment-store", default=os.environ.get("FRAGMENT_STORE", "file:///"),
                      help="the journals' fragment store [$FRAGMENT_STORE] (default file:///, "
                           "which brokers serve with --broker.file-root; on the Helm chart "
                           "with MinIO: s3://gazette/examples/, as operator/examples)")
    pub = sub.add_parser("publish", help="append lines (arguments, else stdin)")
    pub.add_argument("lines", nargs="*")
    ask = sub.add_parser("query", help="a word's count, from any member")
    ask.add_argument("word")
    args = parser.parse_args(argv)
    try:
        return uvloop.run(_main(args))
    except (grpc.aio.AioRpcError, OSError, ValidationError) as err:
        detail = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
        print(f"word_count {args.command}: {detail}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
