"""``gazette serve`` as a process: flags and environment, health, SIGTERM drains and
persists, clear failures; ``gazette dev up --exit`` runs the tutorial end to end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from gazette.keyspace import Etcd, Layout
from gazette.keyspace.specs import apply_changes
from gazette.local import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS
from gazette.local.etcd import EmbeddedEtcd
from gazette.protocol.trees import journal_changes_from_yaml
from gazette_dev.up import EXIT_DONE, SERVING_STOP
from tests.fixtures.procs import free_port

pytestmark = pytest.mark.integration

GAZETTE = [sys.executable, "-m", "gazette_dev.cli"]  # the installed `gazette` command


async def wait_healthy(url: str, proc: asyncio.subprocess.Process, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            assert proc.returncode is None, "the broker exited while starting"
            try:
                async with http.get(url + "/healthz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert asyncio.get_running_loop().time() < deadline, "broker never became healthy"
            await asyncio.sleep(0.05)


async def test_serve_takes_env_and_flags_and_drains_on_sigterm(
    etcd_server: EmbeddedEtcd, etcd_prefix: str, tmp_path: Path,
) -> None:
    grpc_port, http_port = free_port(), free_port()
    env = dict(os.environ, ETCD_ADDRESS=etcd_server.endpoint, ETCD_PREFIX=etcd_prefix,
               BROKER_HTTP_PORT=str(http_port), LOG_FORMAT="json")
    proc = await asyncio.create_subprocess_exec(
        *GAZETTE, "serve", "--broker.port", str(grpc_port), "--broker.host", "127.0.0.1",
        "--broker.file-root", str(tmp_path / "store"), "--broker.spool-dir",
        str(tmp_path / "spools"), env=env, stderr=asyncio.subprocess.PIPE)
    url = f"http://127.0.0.1:{http_port}"
    try:
        await wait_healthy(url, proc)
        # Specs applied to etcd by anyone become journals on the broker.
        async with Etcd(etcd_server.endpoint) as etcd:
            await apply_changes(etcd, Layout(etcd_prefix),
                                journal_changes_from_yaml(TUTORIAL_JOURNALS_YAML))
        async with aiohttp.ClientSession() as http:
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                async with http.put(url + "/example/journal", data=b'{"n": 1}\n') as r:
                    if r.status == 204:
                        break
                assert asyncio.get_running_loop().time() < deadline, "journal never served"
                await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # logs its tasks, and goes on serving
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b'"level": "info"' in err  # --log.format from the environment
    dump = next(json.loads(line) for line in err.splitlines() if b"SIGUSR1: " in line)
    assert "keyspace-watch:" in dump["msg"] and "lease.py" in dump["msg"], dump
    # The open spool was rolled and persisted before exit.
    stored = list((tmp_path / "store" / "example" / "journal").glob("*.sz"))
    assert len(stored) == 1 and stored[0].name.startswith("0000000000000000-0000000000000009-")


@pytest.mark.parametrize(("args", "env", "message"), [
    (["serve", "--broker.port", "abc"], {}, "--broker.port: invalid int value"),
    (["serve"], {"BROKER_PORT": "xyz"}, "$BROKER_PORT='xyz' is not a valid int"),
    (["serve", "--etcd.address", "http://127.0.0.1:1", "--broker.port", "0",
      "--broker.http-port", "0", "--etcd.startup-timeout", "1"], {},
     "cannot start the broker: etcd at http://127.0.0.1:1 did not answer within 1s"),
])
async def test_bad_configuration_fails_clearly(args: list[str], env: dict[str, str],
                                               message: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *GAZETTE, *args, env=dict(os.environ, **env), stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode in (1, 2)
    assert message in err.decode()


async def test_dev_up_runs_the_tutorial_and_exits(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *GAZETTE, "dev", "up", "--exit", "--port", "0", "--http-port", "0",
        "--data-dir", str(tmp_path), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    text = out.decode()
    assert '{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}' in text
    assert 'Gazette!"}\n{"Msg": "See you later alligator"}' in text
    assert "every race 1-20 landed intact: True" in text
    # The specs folded into a tree, the tutorial's label selections, a stale edit refused.
    assert "\n  - name: foobar/part-000\n" in text, text
    for selector, selected in TUTORIAL_SELECTIONS:
        assert re.search(rf"-l {re.escape(repr(selector))}\s+-> "
                         rf"{re.escape(', '.join(selected))}\n", text), selector
    assert "A second edit of example/journal at its old revision is refused" in text
    assert list((tmp_path / "fragment-store" / "example" / "journal").glob("*.sz"))
    # Three brokers in two zones; the replicated journal is on all three, identically.
    brokers = [line for line in text.splitlines() if line.startswith("  broker ")]
    assert len(brokers) == 3 and sum("zone-b#" in b for b in brokers) == 1
    heads = [line.split(": ", 1)[1] for line in text.splitlines()
             if line.startswith("  zone-") and "write head" in line]
    assert len(heads) == 3 and len(set(heads)) == 1, heads
    # A consumer member of word-count counted the lines appended to it, and answered.
    assert re.search(r"consumer member local#consumer-0 of word-count: gRPC http://\S+, "
                     r"HTTP http://\S+\n", text), text
    assert '{"word": "the", "count": 4, "shard": "word-count/count-' in text, text
    # It says it stops by itself, not that Ctrl-C would stop it, nor what to try meanwhile.
    assert f"\n{EXIT_DONE}\n" in text
    assert SERVING_STOP not in text and "Serving. Try:" not in text
