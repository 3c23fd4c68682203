"""gazctl as a process against a real broker: the tutorial's gazctl steps."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from gazette.gazctl.__main__ import ago, broker_address, human_bytes, table
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS
from gazette_broker.server import BrokerServer

pytestmark = pytest.mark.integration


async def gazctl(server: BrokerServer, *args: str, stdin: bytes = b"",
                 env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gazette.gazctl", *args,
        env=dict(os.environ, BROKER_ADDRESS=f"http://{server.grpc_address}", **(env or {})),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_tutorials_gazctl_steps(broker_server: BrokerServer) -> None:
    code, _, err = await gazctl(broker_server, "journals", "apply",
                                stdin=TUTORIAL_JOURNALS_YAML.encode())
    assert code == 0 and "successfully applied revision=" in err
    await broker_server.broker.wait_serving({"example/journal"})

    code, _, _ = await gazctl(broker_server, "journals", "append", "-l",
                              "name=example/journal",
                              stdin=b'{"Msg": "Hello, Gazette!"}\n{"Msg": "Bye"}\n')
    assert code == 0
    code, out, _ = await gazctl(broker_server, "journals", "read", "-l",
                                "name=example/journal")
    assert out == '{"Msg": "Hello, Gazette!"}\n{"Msg": "Bye"}\n'

    code, out, _ = await gazctl(broker_server, "journals", "list", "--primary")
    assert "| example/journal |" in out and "PRIMARY" in out
    assert broker_server.config.suffix in out
    code, out, _ = await gazctl(broker_server, "journals", "list", "--format", "yaml")
    assert "name: example/journal" in out and "revision:" in out
    code, out, _ = await gazctl(broker_server, "journals", "list", "--format", "json")
    assert json.loads(out.splitlines()[0])["spec"]["name"]

    # A stale revision is refused: edit the listed YAML, apply it twice.
    out_yaml = (await gazctl(broker_server, "journals", "list", "-l",
                             "name=example/journal", "--format", "yaml"))[1]
    edited = out_yaml.replace("SNAPPY", "GZIP")
    assert (await gazctl(broker_server, "journals", "apply", stdin=edited.encode()))[0] == 0
    code, _, err = await gazctl(broker_server, "journals", "apply", stdin=edited.encode())
    assert code == 1 and "not applied" in err

    # The foobar/ family (applied with the tutorial's journals) and its selectors.
    for selector, expected in TUTORIAL_SELECTIONS:
        code, out, _ = await gazctl(broker_server, "journals", "list", "-l", selector)
        assert code == 0
        listed = [line.split("|")[1].strip() for line in out.splitlines()
                  if line.startswith("| ") and "NAME" not in line]
        assert listed == list(expected), selector

    await broker_server.broker.replicas["example/journal"].roll()
    await asyncio.wait_for(broker_server.broker.persister.wait_idle(), 10)
    code, out, _ = await gazctl(broker_server, "journals", "fragments", "-l",
                                "name=example/journal")
    assert "| example/journal |" in out and "SNAPPY" in out and "ago" in out


async def test_errors_are_one_line_with_exit_codes(broker_server: BrokerServer) -> None:
    code, _, err = await gazctl(broker_server, "journals", "list", "-l", "name in (")
    assert code == 1 and err.startswith("gazctl: ") and "Traceback" not in err
    code, _, err = await gazctl(broker_server, "journals", "apply", stdin=b"name: [\n")
    assert code == 1 and "Traceback" not in err
    code, _, err = await gazctl(broker_server, "journals", "append", "no/such",
                                stdin=b"x\n")
    assert code == 1 and "JOURNAL_NOT_FOUND" in err
    code, _, err = await gazctl(broker_server, "journals", "bogus")
    assert code == 2


def test_config_resolution_and_formatting(tmp_path: Path) -> None:
    ini = tmp_path / ".config" / "gazette" / "gazctl.ini"
    ini.parent.mkdir(parents=True)
    ini.write_text("[journals]\nAddress = http://localhost:9999\n")
    assert broker_address(None, {"HOME": str(tmp_path)}) == "http://localhost:9999"
    assert broker_address(None, {"HOME": str(tmp_path), "BROKER_ADDRESS": "h:1"}) == "h:1"
    assert broker_address("f:2", {"BROKER_ADDRESS": "h:1"}) == "f:2"
    assert broker_address(None, {"HOME": str(tmp_path / "none")}) == "http://localhost:8080"
    assert human_bytes(43) == "43 B" and human_bytes(2355) == "2.3 KiB"
    assert ago(1000, now=1000 + 8 * 60) == "8 minutes ago" and ago(0) == ""
    assert table(["A", "BB"], [["x", "y"]]).splitlines()[1] == "| A | BB |"
