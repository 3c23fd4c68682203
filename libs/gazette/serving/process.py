"""The set-up of a serving process (a broker, a consumer member): logging, garbage-collector
tuning, and serving until signalled.

`serve_until_signalled` starts a server, runs it until SIGTERM/SIGINT (exit 0) or until
it can no longer serve (lease lost, a task failed for good: exit 1, so its supervisor
restarts it), then stops it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import sys
import time
from typing import Protocol

from gazette.errors import GazetteError
from gazette.keyspace import LeaseLost
from gazette.supervise import TaskFailed, await_chain

log = logging.getLogger(__name__)

#: The levels and formats of ``--log.level`` and ``--log.format``.
LOG_LEVELS = ("debug", "info", "warn", "warning", "error")
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
               + f".{int(record.msecs):03d}Z", "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)-5s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING if level.startswith("warn") else level.upper())


#: Allocations between young-generation collections (CPython's default: 700): a server
#: allocates a few objects per message, and collecting every 700 of them showed up as
#: about 5 % of a broker loop's time under appends.
GC_THRESHOLD = (5_000, 20, 20)


def quiet_gc() -> None:
    """Keep the garbage collector off the hot paths: what exists after start-up (modules,
    the keyspace) is frozen out of collections, and young collections run less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class Server(Protocol):
    async def start(self) -> None: ...

    async def wait(self) -> None: ...

    async def stop(self) -> None: ...


def log_tasks() -> None:
    """Log every asyncio task and what it awaits (on SIGUSR1): where a process that
    seems stuck waits, without stopping it (a thread dump shows only the idle loop)."""
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    log.warning("SIGUSR1: %d tasks\n%s", len(tasks), "\n".join(
        f"{task.get_name()}:\n{await_chain(task)}" for task in tasks))


async def serve_until_signalled(server: Server, what: str) -> int:
    """Start `server` and serve until SIGTERM/SIGINT (0), or until it can no longer
    serve (1); it is stopped (drained) either way. A start that fails is 1, logged."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, log_tasks)
    try:
        await server.start()
    except (OSError, GazetteError) as err:
        log.error("cannot start the %s: %s", what, err)
        return 1
    quiet_gc()
    status = 0
    try:
        async with asyncio.TaskGroup() as tg:
            lost = tg.create_task(server.wait())
            signalled = tg.create_task(stop.wait())
            await asyncio.wait({lost, signalled}, return_when=asyncio.FIRST_COMPLETED)
            if signalled.done():
                log.info("signalled: draining and stopping")
            lost.cancel()
            signalled.cancel()
    except* (LeaseLost, TaskFailed) as group:
        log.error("%s: stopping", group.exceptions[0])
        status = 1
    finally:
        await server.stop()
    return status
