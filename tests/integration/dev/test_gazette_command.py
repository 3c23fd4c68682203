"""The ``gazette`` command's own messages, as a process: ``--version``; ``gazette dev up``
on a port in use (one line, exit 1, nothing left running) and the last words of its
walk-through in each mode (serving until Ctrl-C, or ``--exit``)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import io
import json
import os
import re
import shlex
import signal
import socket
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from gazette.local.etcd import EmbeddedEtcd
from gazette_dev.up import EXIT_DONE, SERVING_STOP, PortProblem, _run
from tests.fixtures.broker import broker_config
from tests.fixtures.polling import eventually
from tests.fixtures.procs import free_port, run_process

pytestmark = pytest.mark.integration

GAZETTE = [sys.executable, "-m", "gazette_dev.cli"]  # the installed `gazette` command
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


async def test_version_prints_the_installed_version_and_exits_0() -> None:
    distribution = tomllib.loads(PYPROJECT.read_text())["project"]["name"]
    code, out, err = await run_process([*GAZETTE, "--version"], dict(os.environ))
    assert code == 0, err
    assert out.decode() == f"gazette {importlib.metadata.version(distribution)}\n"


@contextlib.asynccontextmanager
async def port_held_by(holder: str) -> AsyncIterator[int]:
    """A port in use: by a plain listening socket, or by a gRPC server (which sets
    SO_REUSEPORT, so another gRPC server could bind it too without a word)."""
    if holder == "socket":
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::", 0))
            sock.listen()
            yield sock.getsockname()[1]
    else:
        server = grpc.aio.server()
        port = server.add_insecure_port("[::]:0")
        await server.start()
        try:
            yield port
        finally:
            await server.stop(None)


def processes_naming(folder: Path) -> list[str]:
    """Command lines of live processes with `folder` in an argument (an etcd left
    running would name its data dir)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            if any(str(folder).encode() in arg for arg in argv):
                found.append(b" ".join(argv).decode(errors="replace"))
    return found


async def dev_up_fails(data: Path, *args: str) -> str:
    """``gazette dev up --exit`` that must fail: exit 1, no traceback, nothing left
    running; its one line on stderr."""
    code, _, err = await run_process(
        [*GAZETTE, "dev", "up", "--exit", "--data-dir", str(data), *args],
        dict(os.environ), timeout=90)
    assert code == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    assert processes_naming(data) == []
    return lines[0]


@pytest.mark.parametrize("holder", ["socket", "grpc"])
@pytest.mark.parametrize(("flag", "hint"), [("--port", "another broker or `make demo`?"),
                                            ("--http-port", "another broker or `make demo`?"),
                                            ("--etcd-port", "another etcd?")],
                         ids=["port", "http-port", "etcd-port"])
async def test_dev_up_on_a_port_in_use_says_so_in_one_line(
        tmp_path: Path, flag: str, hint: str, holder: str) -> None:
    async with port_held_by(holder) as port:
        ports = {"--port": "0", "--http-port": "0", flag: str(port)}
        line = await dev_up_fails(tmp_path / "data",
                                  *(arg for item in ports.items() for arg in item))
    assert line == (f"gazette dev up: port {port} is in use ({hint}); "
                    f"choose another with {flag}, or 0 for a free one")


async def test_dev_up_with_one_port_for_grpc_and_http_says_so_in_one_line(
        tmp_path: Path) -> None:
    port = free_port()
    line = await dev_up_fails(tmp_path / "data", "--port", str(port),
                              "--http-port", str(port))
    assert line == (f"gazette dev up: --port and --http-port are both {port}; "
                    "give them different ports, or 0 for free ones")


async def test_a_port_taken_after_the_check_is_the_same_one_line(
        etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path) -> None:
    """A port taken between the check and the broker's start (a race): the start's bind
    error becomes the same message, for `dev_up` to print before it stops etcd."""
    async with port_held_by("socket") as port:
        config = broker_config(etcd_server.endpoint, etcd_prefix, tmp_path, port=port)
        with pytest.raises(PortProblem) as err:
            await _run([config], io.StringIO(), stay=False)
    assert str(err.value) == (
        f"gazette dev up: port {port} is in use (another broker or `make demo`?); "
        "choose another with --port, or 0 for a free one")


async def dev_up_serving(*args: str, env: dict[str, str] | None = None,
                         cwd: Path | None = None) -> tuple[asyncio.subprocess.Process, str]:
    """A ``gazette dev up --port 0 --http-port 0`` process serving, and its output so
    far (through its last line, `SERVING_STOP`)."""
    proc = await asyncio.create_subprocess_exec(
        *GAZETTE, "dev", "up", "--port", "0", "--http-port", "0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env if env is not None else dict(os.environ), cwd=cwd)
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []

    async def until_serving() -> None:
        assert proc.stdout is not None
        while not lines or lines[-1] != SERVING_STOP:
            line = await proc.stdout.readline()
            assert line, "dev up ended its output before serving:\n" + "\n".join(lines)
            lines.append(line.decode().rstrip("\n"))

    try:
        await asyncio.wait_for(until_serving(), 90)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
        await proc.communicate()
        raise
    return proc, "\n".join(lines)


def etcd_data_dir(text: str) -> Path:
    match = re.search(r"etcd \S+ at http://127.0.0.1:\d+ \(data in (\S+)\)", text)
    assert match, text
    return Path(match.group(1))


async def test_dev_up_serves_until_ctrl_c_and_says_so(tmp_path: Path) -> None:
    proc, text = await dev_up_serving("--data-dir", str(tmp_path))
    try:
        assert "\nServing. Try, " in text and EXIT_DONE not in text
        # It does serve: the gateway it names answers.
        match = re.search(r"HTTP (http://localhost:\d+)", text)
        assert match, text
        async with aiohttp.ClientSession() as http, \
                http.get(f"{match.group(1)}/healthz") as r:
            assert r.status == 200
        # So does the consumer member whose query it suggests.
        match = re.search(r"curl (http://localhost:\d+)/word-count/end", text)
        assert match, text
        async with aiohttp.ClientSession() as http, \
                http.get(f"{match.group(1)}/word-count/the") as r:
            assert r.status == 200 and (await r.json())["count"] == 4
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        rest, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert "Stopping: the consumer member, then draining and persisting every broker, then "\
           "etcd." in rest.decode()


ROOT = PYPROJECT.parent


async def run_in_checkout(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`argv` run from the checkout's folder, as a user runs a printed hint."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_dev_up_hints_run_as_printed(tmp_path: Path) -> None:
    """Its hints name the cluster's real addresses in each command and the installed
    commands by path (or the virtualenv to activate), and run as printed from the
    checkout; the docs' commands run with the exports it prints."""
    proc, text = await dev_up_serving("--data-dir", str(tmp_path), cwd=ROOT)
    try:
        etcd = re.search(r"etcd \S+ at (\S+) ", text)
        broker = re.search(r"broker zone-a#broker-0: gRPC (\S+),", text)
        member = re.search(r"consumer member \S+ of word-count: gRPC (\S+), HTTP (\S+)",
                           text)
        assert etcd and broker and member, text
        said = text.split("\nServing. Try", 1)[1].splitlines()
        assert "`source .venv/bin/activate`" in said[0], said[0]
        hints = [line for line in said if line.startswith("  ")]  # the commands
        runnable = {argv[0]: argv for argv in (shlex.split(h) for h in hints)
                    if argv and argv[0].startswith(".venv/bin/") and "shards" not in argv}
        runnable["shards"] = next(shlex.split(h) for h in hints if "shards list" in h)
        assert sorted(runnable) == [".venv/bin/gazctl", ".venv/bin/python", "shards"]
        env = {k: v for k, v in os.environ.items()
               if k not in ("BROKER_ADDRESS", "ETCD_ADDRESS", "CONSUMER_ADDRESS")}
        listed = runnable[".venv/bin/gazctl"]
        assert listed[listed.index("--broker") + 1] == broker.group(1)
        code, out, err = await run_in_checkout(listed, env)
        assert code == 0 and "example/journal" in out, err
        publish = runnable[".venv/bin/python"]
        assert publish[publish.index("--broker.address") + 1] == broker.group(1)
        assert publish[publish.index("--etcd.address") + 1] == etcd.group(1)
        code, out, err = await run_in_checkout(publish, env)
        assert code == 0 and "appended 1 lines" in out, err
        shards = runnable["shards"]
        assert shards[shards.index("--consumer.address") + 1] == member.group(1)
        code, out, err = await run_in_checkout(shards, env)
        assert code == 0 and "word-count/split" in out, err
        # The docs' commands, with the exports it prints: the count of "end" is 1.
        [exports] = [shlex.split(h) for h in hints if h.strip().startswith("export ")]
        variables = dict(item.split("=", 1) for item in exports[1:])
        assert variables == {"BROKER_ADDRESS": broker.group(1),
                             "ETCD_ADDRESS": etcd.group(1),
                             "CONSUMER_ADDRESS": member.group(1)}

        async def counted() -> bool:
            code, out, err = await run_in_checkout(
                [".venv/bin/python", "-m", "gazette_consumer.examples.word_count", "query",
                 "end"], {**env, **variables})
            assert code == 0, err
            return bool(json.loads(out)["count"] == 1)

        await eventually(counted, "the published line is counted", timeout=30)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0


@contextlib.asynccontextmanager
async def dev_up_in(folder: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`dev_up_serving` with its temporary folder under `folder`; on the way out, what a
    failed test left running is killed by pid (dev up itself, and an etcd naming
    `folder`)."""
    proc, text = await dev_up_serving(env={**os.environ, "TMPDIR": str(folder)})
    try:
        yield proc, text
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
        for pid in pids_naming(folder):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def pids_naming(folder: Path) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(folder).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found


async def test_dev_up_stops_and_cleans_up_when_its_terminal_closes(tmp_path: Path) -> None:
    """SIGHUP (the terminal closed) stops it as Ctrl-C does: etcd stopped, its
    temporary folder removed."""
    async with dev_up_in(tmp_path) as (proc, text):
        temp = etcd_data_dir(text).parents[1]
        assert temp.parent == tmp_path and temp.is_dir() and pids_naming(temp)
        proc.send_signal(signal.SIGHUP)
        rest, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-3000:]
        assert "Stopping: the consumer member" in rest.decode()
        assert pids_naming(temp) == [] and not temp.exists()


async def test_a_second_ctrl_c_during_a_slow_drain_stops_at_once(tmp_path: Path) -> None:
    """With etcd frozen the orderly stop takes tens of seconds; a second Ctrl-C ends
    it at once: etcd killed, the temporary folder removed, exit 130."""
    async with dev_up_in(tmp_path) as (proc, text):
        assert proc.stdout is not None
        temp = etcd_data_dir(text).parents[1]
        [etcd] = pids_naming(temp)
        os.kill(etcd, signal.SIGSTOP)
        proc.send_signal(signal.SIGINT)

        async def until_stopping() -> None:
            assert proc.stdout is not None
            while b"Stopping:" not in await proc.stdout.readline():
                pass

        await asyncio.wait_for(until_stopping(), 30)
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 5)  # the orderly stop: 20 s
        assert proc.returncode == 130, err.decode()[-3000:]
        assert "SIGINT again: stopping at once (etcd killed, the brokers not drained)." \
            in err.decode()
        assert pids_naming(temp) == [] and not temp.exists()
