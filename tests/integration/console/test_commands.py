"""The console as commands: ``gazette console`` serves until SIGTERM (exit 0), a bad
flag is one line and exit 2, a port in use exit 1; ``gazette dev up`` prints the
console's address, and the console there shows the local cluster."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.fixtures.procs import free_port, run_process
from tests.integration.dev.test_gazette_command import dev_up_serving

pytestmark = pytest.mark.integration

GAZETTE = [sys.executable, "-m", "gazette_dev.cli"]  # the installed `gazette` command


def env() -> dict[str, str]:
    """This environment without the variables the console's flags fall back to."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("CONSOLE_", "BROKER_", "CONSUMER_", "ETCD_", "TLS_",
                                 "AUTH_"))}


async def test_gazette_console_serves_until_sigterm() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *GAZETTE, "console", "--port", str(port), "--broker.address",
        f"127.0.0.1:{free_port()}", env=env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with aiohttp.ClientSession() as http:
            async def serving() -> bool:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                        return r.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            async with asyncio.timeout(30):
                while not await serving():
                    assert proc.returncode is None, "the console exited"
                    await asyncio.sleep(0.1)  # poll, under the timeout
            async with http.get(f"http://127.0.0.1:{port}/journals") as r:
                assert r.status == 503 and "Broker unreachable" in await r.text()
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_bad_flag_is_one_line_and_exit_2() -> None:
    code, _, err = await run_process([*GAZETTE, "console", "--console.timeout", "0"], env())
    assert code == 2 and "Traceback" not in err, err
    assert err.strip() == "gazette console: console.timeout: must be > 0 seconds, got 0.0"
    code, _, err = await run_process([*GAZETTE, "console", "--broker.address", "a b:c"],
                                     env())
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "broker address from --broker" in err, err


async def test_a_port_in_use_is_exit_1() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code, _, err = await run_process([*GAZETTE, "console", "--port", str(port)], env())
    assert code == 1 and "cannot start the console" in err, err


async def test_dev_up_prints_the_console_which_shows_the_local_cluster(tmp_path: Path
                                                                        ) -> None:
    proc, text = await dev_up_serving("--data-dir", str(tmp_path))
    try:
        match = re.search(r"\n  console (http://127\.0\.0\.1:\d+/) ", text)
        assert match, text
        url = match.group(1)
        assert f"  open {url} in a browser: the web console" in text
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "journals") as r:
                page = await r.text()
                assert r.status == 200 and "example/journal" in page, page
            async with http.get(url + "shards") as r:
                assert r.status == 200 and "word-count/count-000" in await r.text()
            async with http.get(url + "members") as r:
                page = await r.text()
                assert r.status == 200 and "broker-2" in page and "consumer-0" in page
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0
