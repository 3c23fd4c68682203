"""gazctl against a real broker, following the tutorial's gazctl steps.

Appends, reads, edits and the config file run `gazctl` as a process (real stdin,
stdout, $EDITOR and $HOME); listings run `run_async()` on the test's event loop, which
is faster (gRPC's asyncio support wants one event loop per process, so not `run()` in a
thread).
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import yaml

from gazette.gazctl.__main__ import run_async
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS
from gazette.message.framing.fixed import FIXED_FRAME_MAGIC
from gazette_broker import BrokerServer
from tests.fixtures.procs import run_process

pytestmark = pytest.mark.integration

GAZCTL = str(Path(sys.executable).parent / "gazctl")


def _env(server: BrokerServer | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("BROKER_ADDRESS", "EDITOR", "LOG_LEVEL", "LOG_FORMAT")}
    if server is not None:
        env["BROKER_ADDRESS"] = f"http://{server.grpc_address}"
    env.update(extra or {})
    return env


async def gazctl(server: BrokerServer | None, *args: str, stdin: bytes = b"",
                 env: dict[str, str] | None = None,
                 timeout: float = 30.0) -> tuple[int, str, str]:
    """`gazctl args...` as a process: (exit status, stdout, stderr); AssertionError if
    it has not finished within `timeout` seconds."""
    code, out, err = await run_process([GAZCTL, *args], _env(server, env), stdin, timeout)
    return code, out.decode(), err


async def inproc(server: BrokerServer, *args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """gazctl in this process, with captured streams."""
    out, err = io.BytesIO(), io.StringIO()
    code = await run_async(list(args), stdin=io.BytesIO(stdin), stdout=out, stderr=err,
                           env=_env(server))
    return code, out.getvalue().decode(), err.getvalue()


def names_in(table_text: str) -> list[str]:
    """The first column of a table's rows."""
    return [line.split("|")[1].strip() for line in table_text.splitlines()[3:-1]]


async def test_the_tutorials_gazctl_steps(broker_server: BrokerServer) -> None:
    server = broker_server
    code, _, err = await gazctl(server, "journals", "apply", stdin=TUTORIAL_JOURNALS_YAML.encode())
    assert code == 0 and "INFO[0000] successfully applied revision=" in err, err
    await asyncio.wait_for(server.broker.wait_serving(
        {"example/journal", "foobar/part-000", "foobar/part-001", "foobar/part-002"}), 10)

    # Append lines from stdin and read them back, as the tutorial does.
    code, _, err = await gazctl(server, "journals", "append", "-l", "name=example/journal",
                                stdin=b'{"Msg": "Hello, Gazctl!"}\n{"Msg": "Bye"}\n')
    assert code == 0, err
    code, out, err = await gazctl(server, "journals", "read", "-l", "name=example/journal")
    assert code == 0 and out == '{"Msg": "Hello, Gazctl!"}\n{"Msg": "Bye"}\n'
    assert "read started journal=example/journal offset=0" in err

    # list: the table with its primary (the broker's suffix), YAML with revisions, JSON.
    code, out, _ = await inproc(server, "journals", "list", "--primary", "--replicas")
    assert code == 0
    assert [c.strip() for c in out.splitlines()[1].split("|")[1:-1]] == [
        "NAME", "PRIMARY", "REPLICAS"]
    assert f"| example/journal | {server.config.suffix} " in out
    assert names_in(out) == ["example/journal", "foobar/part-000", "foobar/part-001",
                             "foobar/part-002"]
    code, listed_yaml, _ = await inproc(server, "journals", "list", "-l",
                                        "name=example/journal", "--format", "yaml")
    doc = yaml.safe_load(listed_yaml)
    assert doc["name"] == "example/journal" and doc["fragment"]["compression_codec"] == "SNAPPY"
    revision = doc["revision"]
    code, out, _ = await inproc(server, "journals", "list", "--format", "json")
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["name"] for o in objs] == names_in(await _table(server))
    assert objs[0]["spec"]["labels"][0] == {"name": "app.gazette.dev/message-type",
                                            "value": "TestMessage"}
    assert objs[0]["mod_revision"] == revision
    assert objs[0]["route"]["members"] == [{"zone": "local", "suffix": server.config.suffix}]

    # The tutorial's selectors, in every format.
    for selector, expected in TUTORIAL_SELECTIONS:
        code, out, _ = await inproc(server, "journals", "list", "-l", selector)
        assert code == 0 and names_in(out) == list(expected), selector
        code, out, _ = await inproc(server, "journals", "list", "-l", selector, "-o", "json")
        assert [json.loads(line)["name"] for line in out.splitlines()] == list(expected)
        code, out, _ = await inproc(server, "journals", "list", "-l", selector, "-o", "yaml")
        assert all(f"name: {name}" in out for name in expected), selector

    # edit through $EDITOR (a shell command, as EDITOR="code --wait" would be).
    code, _, err = await gazctl(server, "journals", "edit", "-l", "name=example/journal",
                                env={"EDITOR": "sed -i s/SNAPPY/GZIP/"})
    assert code == 0 and "successfully applied revision=" in err, err
    code, out, _ = await inproc(server, "journals", "list", "-l", "name=example/journal",
                                "--format", "yaml")
    assert yaml.safe_load(out)["fragment"]["compression_codec"] == "GZIP"
    code, _, err = await gazctl(server, "journals", "edit", "-l", "name=example/journal",
                                env={"EDITOR": "true"})
    assert code == 0 and "Edit cancelled, no changes made." in err

    # The YAML listed before the edit is stale now: refused, naming the revision.
    code, _, err = await inproc(server, "journals", "apply", stdin=listed_yaml.encode())
    assert code == 1
    assert f"the spec of example/journal changed since revision {revision}" in err, err
    assert len(err.strip().splitlines()) == 1

    # A roll and an upload later, the fragments table shows the persisted fragment.
    await server.broker.replicas["example/journal"].roll()
    await asyncio.wait_for(server.broker.persister.wait_idle(), 10)
    code, out, _ = await inproc(server, "journals", "fragments", "-l", "name=example/journal")
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()[3:-1]]
    assert [c.strip() for c in out.splitlines()[1].split("|")[1:-1]] == [
        "JOURNAL", "OFFSET", "LENGTH", "PERSISTED", "SHA1", "COMPRESSION"]
    assert rows[0][:3] == ["example/journal", "0", "41 B"]
    assert rows[0][3] == "now" or rows[0][3].endswith("ago")
    assert len(rows[0][4]) == 15 and rows[0][4].endswith("...") and rows[0][5] == "SNAPPY"
    code, out, _ = await inproc(server, "journals", "fragments", "-l", "name=example/journal",
                                "--format", "json", "--url")
    frag = json.loads(out.splitlines()[0])
    assert (frag["begin"], frag["end"], frag["backing_store"]) == (0, 41, "file:///")
    assert len(frag["sha1"]) == 40 and frag["signed_url"].startswith("file://")
    code, out, _ = await inproc(server, "journals", "fragments", "-l", "name=example/journal",
                                "--from", str(int(time.time()) + 3600))
    assert names_in(out) == []


async def _table(server: BrokerServer) -> str:
    return (await inproc(server, "journals", "list"))[1]


class _Terminal(io.StringIO):
    """A captured stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


async def test_fragments_shows_progress_on_a_terminal_only(broker_server: BrokerServer) -> None:
    server = broker_server
    await server.apply_yaml(TUTORIAL_JOURNALS_YAML)
    for journal in sorted(server.broker.replicas):  # open fragments: no "ago" that ticks
        await server.broker.replicas[journal].append(_one(b"%s\n" % journal.encode()))
    for args in (["journals", "fragments"], ["journals", "fragments", "--format", "json"]):
        code, plain, plain_err = await inproc(server, *args)
        assert code == 0 and plain_err == ""  # stderr is no terminal: no bar
        out, err = io.BytesIO(), _Terminal()
        code = await run_async(args, stdin=io.BytesIO(), stdout=out, stderr=err,
                               env=_env(server))
        assert code == 0 and out.getvalue().decode() == plain  # the same output
        frames = err.getvalue().split("\r")
        assert frames[1] == "[" + "." * 30 + "] 0/4 journals listed"
        assert frames[-3].startswith("[" + "#" * 30 + "] 4/4 journals listed  ")
        assert frames[-2].strip() == "" and frames[-1] == ""  # erased when done
        assert sorted(f.split("  ")[1].strip() for f in frames[2:-2]) == sorted(
            server.broker.replicas)


async def _one(data: bytes):  # type: ignore[no-untyped-def]
    yield data


async def test_read_block_follows_appends(broker_server: BrokerServer) -> None:
    server = broker_server
    await server.apply_yaml(TUTORIAL_JOURNALS_YAML)
    code, _, _ = await gazctl(server, "journals", "append", "foobar/part-000", stdin=b"old\n")
    assert code == 0
    reader = await asyncio.create_subprocess_exec(
        GAZCTL, "journals", "read", "-l", "prefix=foobar/", "--block", "--tail",
        "--log.level=debug", env=_env(server), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert reader.stdout is not None and reader.stderr is not None
    try:
        # Once it has started reading each journal, appends to either reach stdout.
        started = b""
        async with asyncio.timeout(15):
            while started.count(b"read started") < 3:
                started += await reader.stderr.readline()
        await asyncio.sleep(0.2)  # resolving --tail's write head
        writer = await asyncio.create_subprocess_exec(
            GAZCTL, "journals", "append", "-l", "name=foobar/part-001", env=_env(server),
            stdin=asyncio.subprocess.PIPE)
        assert writer.stdin is not None
        writer.stdin.write(b"first\n")
        await writer.stdin.drain()
        async with asyncio.timeout(10):  # streamed: it is appended before stdin ends
            assert await reader.stdout.readline() == b"first\n"
        writer.stdin.write(b"second\nthird\n")
        writer.stdin.close()
        assert await asyncio.wait_for(writer.wait(), 10) == 0
        async with asyncio.timeout(10):
            assert await reader.stdout.readline() == b"second\n"
            assert await reader.stdout.readline() == b"third\n"
        assert (await inproc(server, "journals", "append", "foobar/part-000",
                             stdin=b"new\n"))[0] == 0
        async with asyncio.timeout(10):
            assert await reader.stdout.readline() == b"new\n"  # not "old": --tail
        async with asyncio.timeout(5):
            while b"read is ready" not in (line := await reader.stderr.readline()):
                assert line
        assert b"fragment.Begin=" in line and b"journal=foobar/part-00" in line
    finally:
        if reader.returncode is None:
            reader.terminate()
        code = await asyncio.wait_for(reader.wait(), 10)
    assert code == 0  # SIGTERM ends a read quietly


async def test_framings_and_errors(broker_server: BrokerServer, tmp_path: Path) -> None:
    server = broker_server
    code, _, err = await gazctl(server, "journals", "apply", stdin=TUTORIAL_JOURNALS_YAML.encode())
    assert code == 0, err
    await asyncio.wait_for(server.broker.wait_serving({"foobar/part-002"}), 10)

    # --framing fixed: whole frames; none: all of stdin as one append.
    frames = b"".join(FIXED_FRAME_MAGIC + len(p).to_bytes(4, "little") + p
                      for p in (b"one", b"two" * 100, b""))
    code, _, err = await gazctl(server, "journals", "append", "foobar/part-002",
                                "--framing", "fixed", stdin=frames)
    assert code == 0, err
    code, _, err = await gazctl(server, "journals", "append", "foobar/part-002",
                                "--framing", "none", stdin=b"raw bytes \x00\xff, no newline")
    assert code == 0, err
    code, raw, _ = await _read_bytes(server, "name=foobar/part-002")
    assert raw == frames + b"raw bytes \x00\xff, no newline"
    code, raw, _ = await _read_bytes(server, "name=foobar/part-002", "--offset", "11")
    assert raw == (frames + b"raw bytes \x00\xff, no newline")[11:]
    # Bad input: the whole frames before it are appended, then gazctl fails.
    code, _, err = await gazctl(server, "journals", "append", "foobar/part-002",
                                "--framing", "fixed", stdin=frames + b"junk!!!!!")
    assert code == 1 and "Traceback" not in err
    assert f"stdin: input offset {len(frames)}: not a fixed frame header" in err
    code, _, err = await gazctl(server, "journals", "append", "foobar/part-002",
                                "--framing", "fixed", stdin=frames[:-3])
    assert code == 1 and "the input ended inside a record (5 bytes left over)" in err
    code, raw, _ = await _read_bytes(server, "name=foobar/part-002")
    assert raw == frames + b"raw bytes \x00\xff, no newline" + frames + frames[:-8]

    # Usage errors exit 2; failures exit 1; one line each, no traceback.
    cases = [
        (["journals", "list", "-l", "name in ("], b"", 2, "bad selector"),
        (["journals", "read", "-l", "a=b=c"], b"", 2, "bad selector"),
        (["journals", "list", "--format", "xml"], b"", 2, "invalid choice"),
        (["journals", "bogus"], b"", 2, "invalid choice"),
        (["journals", "apply"], b"name: [\n", 1, "stdin: invalid journal specs: yaml: line 2"),
        (["journals", "apply"], b"name: a/b\nreplication: 0\n", 1,
         "invalid journal specs: a/b: replication: must be at least 1"),
        (["journals", "apply"], b"", 1, "no journal specs"),
        (["journals", "apply", "-f", str(tmp_path / "none.yaml")], b"", 1, "cannot read"),
        (["journals", "apply"], TUTORIAL_JOURNALS_YAML.encode(), 1,
         "example/journal already exists"),
        (["journals", "append", "no/such"], b"x\n", 1, "JOURNAL_NOT_FOUND for journal no/such"),
        (["journals", "append", "-l", "prefix=foobar/"], b"x\n", 1, "matches 3 journals"),
        (["journals", "append", "-l", "name=no/such"], b"x\n", 1, "no journal matches"),
        (["journals", "read", "-l", "name=no/such"], b"", 0, "no journals were matched"),
        (["journals", "edit", "-l", "name=no/such"], b"", 1, "no journals match"),
    ]
    results = await asyncio.gather(*(gazctl(server, *argv, stdin=stdin)
                                     for argv, stdin, _, _ in cases))
    for (argv, _, want, message), (code, _, err) in zip(cases, results, strict=True):
        assert (code, "Traceback" in err) == (want, False), (argv, err)
        assert message in err and len(err.strip().splitlines()) == 1, (argv, err)

    # An unreachable broker: a clear message, soon.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    code, _, err = await gazctl(None, "journals", "list",
                                env={"BROKER_ADDRESS": f"127.0.0.1:{port}"})
    assert code == 1 and "UNAVAILABLE" in err
    assert f"is a broker listening at 127.0.0.1:{port}" in err
    assert "$BROKER_ADDRESS" in err and time.monotonic() - started < 10


async def _read_bytes(server: BrokerServer, selector: str, *args: str) -> tuple[int, bytes, str]:
    proc = await asyncio.create_subprocess_exec(
        GAZCTL, "journals", "read", "-l", selector, *args, env=_env(server),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out, err.decode()


async def test_prune_and_the_config_file(broker_server: BrokerServer, tmp_path: Path) -> None:
    server = broker_server
    # The tutorial's config file, in a $HOME of our own: no $BROKER_ADDRESS needed.
    home = tmp_path / "home"
    (home / ".config" / "gazette").mkdir(parents=True)
    (home / ".config" / "gazette" / "gazctl.ini").write_text(
        f"[journals.Broker]\nAddress = http://{server.grpc_address}\n")
    specs = ("name: prune/\nreplication: 1\nfragment:\n  stores: [file:///]\n"
             "  retention: 1s\nchildren:\n- name: prune/aged\n"
             "- name: prune/kept\n  fragment:\n    retention: 0s\n")
    code, _, err = await gazctl(None, "journals", "apply", stdin=specs.encode(),
                                env={"HOME": str(home)})
    assert code == 0 and "successfully applied" in err, err
    await asyncio.wait_for(server.broker.wait_serving({"prune/aged", "prune/kept"}), 10)
    for journal in ("prune/aged", "prune/kept"):
        for _ in range(2):
            assert (await inproc(server, "journals", "append", journal,
                                 stdin=b"x" * 100 + b"\n"))[0] == 0
            await server.broker.replicas[journal].roll()
        await asyncio.wait_for(server.broker.persister.wait_idle(), 10)
    assert server.file_root is not None
    aged_dir = server.file_root / "prune" / "aged"
    assert len(list(aged_dir.iterdir())) == 2
    await asyncio.sleep(2.1)  # older than the 1s retention (mod times are whole seconds)

    code, out, err = await inproc(server, "journals", "prune", "-l", "prefix=prune/",
                                  "--dry-run")
    assert code == 0, err
    assert names_in("\n".join(out.splitlines()[:-1])) == ["prune/aged", "prune/aged"]
    assert out.splitlines()[-1] == ("would prune 2 fragments (202 B) of 1 journal; "
                                    "0 fragments (0 B) kept")
    assert "journal keeps its fragments for ever (retention 0s); skipped journal=prune/kept" \
        in err
    assert len(list(aged_dir.iterdir())) == 2

    code, _, err = await gazctl(server, "journals", "prune", "-l", "prefix=prune/")
    assert code == 1 and "give its folder with --file-root" in err
    code, out, err = await gazctl(None, "journals", "prune", "-l", "prefix=prune/",
                                  "--file-root", str(server.file_root),
                                  env={"HOME": str(home)})
    assert code == 0, err
    assert out.splitlines()[-1].startswith("pruned 2 fragments (202 B) of 1 journal")
    assert list(aged_dir.iterdir()) == []
    assert len(list((server.file_root / "prune" / "kept").iterdir())) == 2


def _append_spans(err: str) -> list[tuple[int, int]]:
    """(begin, end) of each append, from gazctl's ``--log.level=debug`` lines."""
    spans = []
    for line in err.splitlines():
        if "append response" in line:
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            spans.append((int(fields["begin"]), int(fields["end"])))
    return spans


def _record_ends(content: bytes) -> set[int]:
    """The offsets where the lines of `content` end (and its end)."""
    ends, pos = {len(content)}, content.find(b"\n")
    while pos >= 0:
        ends.add(pos + 1)
        pos = content.find(b"\n", pos + 1)
    return ends


async def test_append_a_record_over_the_high_water_mark_whole(
        broker_server: BrokerServer) -> None:
    server = broker_server
    await server.apply_yaml("name: big/\nreplication: 1\nchildren:\n- name: big/one\n"
                            "- name: big/mixed\n- name: big/frame\n- name: big/limit\n")
    big = b"x" * (5 << 20) + b"\n"  # over gazctl's 4 MiB high-water mark of buffered input
    mixed = b"before\n" + big + b"after 1\nafter 2\n" + b"y" * (5 << 20)  # last: no newline
    frame = FIXED_FRAME_MAGIC + (5 << 20).to_bytes(4, "little") + b"z" * (5 << 20)
    runs = [("big/one", big, "lines"), ("big/mixed", mixed, "lines"),
            ("big/frame", frame, "fixed")]
    for journal, content, framing in runs:
        code, _, err = await gazctl(server, "journals", "append", journal, "--framing",
                                    framing, "--log.level=debug", stdin=content, timeout=30)
        assert code == 0, (journal, err[-500:])
        code, raw, _ = await _read_bytes(server, f"name={journal}")
        assert code == 0 and raw == content, journal  # all of it, in order
        # Never split: the appends tile the content, each ending where a record ends.
        spans = _append_spans(err)
        assert spans[0][0] == 0 and spans[-1][1] == len(content), (journal, spans)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), spans
        ends = {len(content)} if framing == "fixed" else _record_ends(content)
        assert {end for _, end in spans} <= ends, (journal, spans)

    # A record over --max-record-size fails, naming its input offset and the limit;
    # the whole records before it are appended.
    code, _, err = await gazctl(server, "journals", "append", "big/limit",
                                "--max-record-size", str(1 << 20),
                                stdin=b"small\n" + b"w" * (2 << 20) + b"\nlater\n")
    assert code == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "gazctl: stdin: input offset 6: a record is longer than the limit of 1048576 bytes "
        "(1.0 MiB); --max-record-size sets it")
    code, raw, _ = await _read_bytes(server, "name=big/limit")
    assert raw == b"small\n"


async def test_read_offset_beyond_int64_is_a_usage_error(broker_server: BrokerServer) -> None:
    server = broker_server
    await server.apply_yaml("name: offsets/journal\nreplication: 1\n")
    code, _, err = await gazctl(server, "journals", "read", "-l", "name=offsets/journal",
                                "--offset", "99999999999999999999999")
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert ("--offset: must be at most 9223372036854775807, got 99999999999999999999999"
            in err), err
    # The largest offset there is: valid, and nothing is there yet.
    code, out, err = await gazctl(server, "journals", "read", "-l", "name=offsets/journal",
                                  "--offset", str(2**63 - 1))
    assert (code, out) == (0, ""), err


async def test_version() -> None:
    from importlib.metadata import version

    code, out, err = await gazctl(None, "--version")
    assert (code, err) == (0, "")
    assert out == f"gazctl {version('gazette-py')}\n"
