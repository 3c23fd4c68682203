"""Gazette's broker tutorial ("Brokers: A Tutorial Introduction"), end to end, with the
real pieces only:

* etcd: the session's shared etcd, under a prefix of this test's own;
* a ``gazette serve`` process (``--broker.id busy-walrus``, as the tutorial's listings
  show), its store being a ``file:///`` folder (``--broker.file-root``) or an
  ``s3://bucket/prefix/`` on the moto server (the standard AWS environment);
* the machine's ``curl`` for the tutorial's curl commands, as written (port aside);
* the ``gazctl`` console script as a process, configured by the tutorial's
  ``$HOME/.config/gazette/gazctl.ini`` in a home of the test's own.

The steps run in the tutorial's order and share one broker, so each builds on what the
previous ones wrote. The one departure from the tutorial's specs (besides the store) is
example/journal's ``fragment.flush_interval``: 1s, where the tutorial's fragments roll
every minute, so that its appends roll several fragments, which the broker persists
while the test watches.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from gazette.fragment import Fragment, decompress
from gazette.local.etcd import EmbeddedEtcd
from gazette.local.tutorial import EXAMPLE_JOURNAL_YAML, FOOBAR_TREE_YAML, TUTORIAL_SELECTIONS
from gazette.protocol import CompressionCodec
from tests.fixtures.procs import free_port, run_process
from tests.fixtures.s3 import S3Bucket, S3Server
from tests.integration.broker.test_broker_process import wait_healthy

pytestmark = pytest.mark.integration

GAZETTE = [sys.executable, "-m", "gazette_broker.cli"]
GAZCTL = str(Path(sys.executable).parent / "gazctl")
CURL = "/usr/bin/curl"

BROKER_ID = "busy-walrus"
JOURNAL = "example/journal"
FOOBAR = ("foobar/part-000", "foobar/part-001", "foobar/part-002")
#: The spool rolls (and is persisted) once its first append is this old.
FLUSH_INTERVAL = "1s"
HELLO = b'{"Msg": "Hello, Gazette!"}\n{"Msg": "See you later alligator"}\n'
GAZCTL_HELLO = b'{"Msg": "Hello, Gazctl!"}\n'
#: A stored fragment's name: <journal>/<begin>-<end>-<sha1>.<ext>.
FRAGMENT_NAME = re.compile(
    r"(?P<journal>.+)/(?P<begin>[0-9a-f]{16})-(?P<end>[0-9a-f]{16})-(?P<sha1>[0-9a-f]{40})"
    r"(?P<ext>\.[a-z]+)")
EXTENSIONS = {CompressionCodec.SNAPPY: ".sz", CompressionCodec.GZIP: ".gz",
              CompressionCodec.ZSTANDARD: ".zst"}
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                   "ALL_PROXY")

T = TypeVar("T")


# -- polling and processes ------------------------------------------------------------


async def eventually(check: Callable[[], Awaitable[T | None]], what: str,
                     timeout: float = 20.0, interval: float = 0.1) -> T:
    """Poll `check` until it returns something other than None, failing after `timeout`
    seconds (naming `what` was awaited)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result is not None:
            return result
        assert loop.time() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(interval)


class Collected:
    """Everything a running process writes to a stream, as it comes."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.data = bytearray()
        self._task = asyncio.create_task(self._pump(stream))

    async def _pump(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            self.data += chunk

    async def close(self) -> bytes:
        await asyncio.wait_for(self._task, 10)
        return bytes(self.data)


# -- the stores ------------------------------------------------------------------------


@dataclass
class Store:
    """Where the broker persists fragments: the URL the specs name, the broker's
    environment, and a listing of what is stored (journal-relative key -> stored bytes)."""

    url: str
    env: dict[str, str]
    file_root: Path
    list_objects: Callable[[], dict[str, bytes]]

    async def objects(self) -> dict[str, bytes]:
        return await asyncio.to_thread(self.list_objects)


def file_store(root: Path) -> Store:
    def list_objects() -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file()}

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return Store("file:///", env, root, list_objects)


def s3_store(server: S3Server, bucket: S3Bucket, root: Path) -> Store:
    prefix = "fragment-store/"

    def list_objects() -> dict[str, bytes]:
        client = server.client()
        try:
            found = {}
            for page in client.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket.name, Prefix=prefix):
                for obj in page.get("Contents", []):
                    body = client.get_object(Bucket=bucket.name, Key=obj["Key"])["Body"]
                    found[obj["Key"].removeprefix(prefix)] = body.read()
            return found
        finally:
            client.close()

    # The broker takes the endpoint, region, credentials and path-style addressing from
    # the standard AWS environment, as a deployment would.
    return Store(f"s3://{bucket.name}/{prefix}", server.env(), root, list_objects)


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    root = tmp_path / "fragment-store"  # the broker's --broker.file-root (file:/// only)
    if request.param == "file":
        return file_store(root)
    return s3_store(request.getfixturevalue("s3_server"),
                    request.getfixturevalue("s3_bucket"), root)


def with_store(spec_yaml: str, url: str) -> str:
    """A tutorial spec with its ``file:///`` store replaced by `url`."""
    assert spec_yaml.count("  - file:///\n") == 1
    return spec_yaml.replace("  - file:///\n", f"  - {url}\n")


def example_spec(url: str) -> str:
    """The tutorial's example/journal, stored at `url`, its spool flushed every second."""
    assert "flush_interval" not in EXAMPLE_JOURNAL_YAML
    return with_store(EXAMPLE_JOURNAL_YAML, url) + f"  flush_interval: {FLUSH_INTERVAL}\n"


# -- the broker process and the tutorial's tools ---------------------------------------


@dataclass
class Broker:
    proc: asyncio.subprocess.Process
    grpc_port: int
    http_port: int
    log: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@pytest.fixture
async def broker(store: Store, etcd_server: EmbeddedEtcd, etcd_prefix: str,
                 tmp_path: Path) -> AsyncIterator[Broker]:
    """``gazette serve`` as the tutorial starts it (plus free ports, etcd and spools)."""
    assert os.access(CURL, os.X_OK), f"the tutorial's curl steps need {CURL} (apt-get install curl)"
    grpc_port, http_port = free_port(), free_port()
    log = tmp_path / "broker.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *GAZETTE, "serve", "--broker.id", BROKER_ID, "--broker.host", "127.0.0.1",
            "--broker.bind", "127.0.0.1", "--broker.port", str(grpc_port),
            "--broker.http-port", str(http_port), "--broker.file-root", str(store.file_root),
            "--broker.spool-dir", str(tmp_path / "spools"),
            "--etcd.address", etcd_server.endpoint, "--etcd.prefix", etcd_prefix,
            env=store.env, stdin=asyncio.subprocess.DEVNULL, stdout=out,
            stderr=asyncio.subprocess.STDOUT)
    broker = Broker(proc, grpc_port, http_port, log)
    try:
        await wait_healthy(f"http://127.0.0.1:{http_port}", proc)
        yield broker
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@pytest.fixture
def home(broker: Broker, tmp_path: Path) -> Path:
    """A $HOME with the tutorial's gazctl.ini pointing at the broker."""
    home = tmp_path / "home"
    (home / ".config" / "gazette").mkdir(parents=True)
    (home / ".config" / "gazette" / "gazctl.ini").write_text(
        f"[journals.Broker]\nAddress = http://127.0.0.1:{broker.grpc_port}\n")
    return home


@dataclass
class Tutorial:
    """The tutorial's session: a broker, its store, a home with gazctl.ini."""

    broker: Broker
    store: Store
    home: Path
    #: The journal's content as last read in full.
    content: bytes = b""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.broker.http_port}/{JOURNAL}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # Our own $HOME: gazctl reads its gazctl.ini there, curl finds no .curlrc.
        env = {k: v for k, v in os.environ.items()
               if k not in ("BROKER_ADDRESS", "EDITOR", "LOG_LEVEL", "LOG_FORMAT",
                            *PROXY_VARIABLES)}
        env["HOME"] = str(self.home)
        env.update(extra or {})
        return env

    async def gazctl(self, *args: str, stdin: bytes = b"",
                     env: dict[str, str] | None = None) -> tuple[int, str, str]:
        code, out, err = await run_process([GAZCTL, *args], self.env(env), stdin)
        return code, out.decode(), err

    async def ok(self, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None,
                 ) -> tuple[str, str]:
        """gazctl, which must succeed: (stdout, stderr)."""
        code, out, err = await self.gazctl(*args, stdin=stdin, env=env)
        assert code == 0, (args, err, self.broker.log_tail())
        return out, err

    async def curl(self, *args: str, stdin: bytes = b"") -> bytes:
        """curl, which must succeed: its stdout."""
        code, out, err = await run_process([CURL, *args], self.env(), stdin)
        assert code == 0, (args, err, self.broker.log_tail())
        return out

    async def put(self, *args: str, stdin: bytes = b"") -> None:
        """A curl PUT: an accepted append answers 204 with no body (an error would print
        its reason)."""
        assert await self.curl("-X", "PUT", *args, stdin=stdin) == b""

    async def read_all(self) -> bytes:
        self.content = await self.curl(self.url)
        return self.content


def table_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """A boxed table's header and rows, as stripped cells."""
    lines = text.strip().splitlines()
    assert lines[0].startswith("+-") and lines[2].startswith("+-") and \
        lines[-1].startswith("+-"), text

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.split("|")[1:-1]]

    return cells(lines[1]), [cells(line) for line in lines[3:-1]]


def stored_fragments(objects: dict[str, bytes], journal: str) -> list[tuple[Fragment, bytes]]:
    """The store's fragments of `journal`, in offset order, each with its content; every
    object must be named as Gazette names fragments and hold what its name says."""
    out = []
    for key, body in objects.items():
        m = FRAGMENT_NAME.fullmatch(key)
        assert m is not None, f"{key!r} is not named <journal>/<begin>-<end>-<sha1>.<ext>"
        if m["journal"] != journal:
            continue
        frag = Fragment.parse_path(key)
        assert EXTENSIONS[frag.codec] == m["ext"]
        content = decompress(frag.codec, body)
        assert hashlib.sha1(content).hexdigest() == m["sha1"], key
        assert len(content) == frag.end - frag.begin, key
        out.append((frag, content))
    return sorted(out, key=lambda fc: fc[0].begin)


# -- the tutorial's steps --------------------------------------------------------------


async def apply_example_journal(t: Tutorial) -> None:
    """``gazctl journals apply`` of example/journal; the broker then serves it."""
    _, err = await t.ok("journals", "apply",
                        stdin=example_spec(t.store.url).encode())
    assert re.search(r"^INFO\[\d{4}\] successfully applied revision=\d+$", err, re.M), err

    async def served() -> bool | None:
        # Until the broker has opened the journal, the gateway answers JOURNAL_NOT_FOUND;
        # then an empty journal has nothing at offset 0 yet.
        out = await t.curl(t.url)
        if out.startswith(b"JOURNAL_NOT_FOUND"):
            return None
        assert out.startswith(b"OFFSET_NOT_YET_AVAILABLE"), out
        return True

    await eventually(served, f"the broker to serve {JOURNAL}")


async def wait_primaries(t: Tutorial, journals: Sequence[str]) -> None:
    """Until ``gazctl journals list --primary`` shows exactly `journals`, each served by
    our broker (a journal is served once the broker has opened it)."""
    want = [[name, BROKER_ID] for name in journals]

    async def listed() -> bool | None:
        header, rows = table_rows((await t.ok("journals", "list", "--primary"))[0])
        assert header == ["NAME", "PRIMARY"]
        return True if rows == want else None

    await eventually(listed, f"{journals} served by {BROKER_ID}", interval=0.2)


async def first_appends_and_reads(t: Tutorial) -> None:
    await t.put("--data-binary", "@-", t.url, stdin=HELLO)
    assert await t.read_all() == HELLO
    assert await t.curl(f"{t.url}?offset=16") == \
        b'Gazette!"}\n{"Msg": "See you later alligator"}\n'


async def concurrent_appends(t: Tutorial) -> None:
    """20 raced PUTs land whole, each once, in some order."""
    await asyncio.gather(*(
        t.put("--data-binary", '{"Msg": "Race!", "N": ' + str(i) + '}\n', t.url)
        for i in range(1, 21)))
    content = await t.read_all()
    assert content.startswith(HELLO)
    lines = content[len(HELLO):].splitlines(keepends=True)
    messages = [json.loads(line) for line in lines]  # raises on an interleaved line
    assert sorted(m["N"] for m in messages) == list(range(1, 21))
    assert lines == [b'{"Msg": "Race!", "N": %d}\n' % m["N"] for m in messages]


async def streaming_read(t: Tutorial) -> None:
    """A blocking curl read from the write head sees appends made after it started,
    by curl and by ``gazctl journals append``."""
    before = await t.read_all()
    reader = await asyncio.create_subprocess_exec(
        CURL, "-sN", f"{t.url}?block=true&offset=-1", env=t.env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert reader.stdout is not None
    streamed = Collected(reader.stdout)
    try:
        # The reader resolves offset -1 at some moment after it connects, which nothing
        # shows from outside: append until an append reaches it (almost always the first).
        tries = 0

        async def reached() -> bool | None:
            nonlocal tries
            assert reader.returncode is None, "the blocking read ended"
            tries += 1
            await t.put("--data-binary", '{"Msg": "Streaming!", "Try": ' + str(tries) + '}\n',
                        t.url)
            for _ in range(20):
                if streamed.data:
                    return True
                await asyncio.sleep(0.05)
            return None

        await eventually(reached, "the blocking read to see an append", interval=0)
        await t.ok("journals", "append", "-l", f"name={JOURNAL}", stdin=GAZCTL_HELLO)

        async def got_gazctl_line() -> bool | None:
            return True if streamed.data.endswith(GAZCTL_HELLO) else None

        await eventually(got_gazctl_line, "the gazctl append on the blocking read")
        assert reader.returncode is None  # still following the journal
    finally:
        if reader.returncode is None:
            reader.terminate()
        await asyncio.wait_for(reader.wait(), 10)
    out = await streamed.close()
    content = await t.read_all()
    # What the reader saw is the journal from one of the curl appends to its end.
    assert content.startswith(before) and content.endswith(out)
    assert out.startswith(b'{"Msg": "Streaming!", "Try": ')
    assert [json.loads(line)["Msg"] for line in out.splitlines()] == \
        ["Streaming!"] * (len(out.splitlines()) - 1) + ["Hello, Gazctl!"]


async def gazctl_read(t: Tutorial) -> None:
    out, err = await t.ok("journals", "read", "-l", f"name={JOURNAL}")
    assert out.encode() == t.content
    assert f"read started journal={JOURNAL} offset=0" in err


async def wait_stored(t: Tutorial, end: int) -> list[tuple[Fragment, bytes]]:
    """Until the store holds example/journal's content up to `end` (no more, no less)."""

    async def stored() -> list[tuple[Fragment, bytes]] | None:
        objects = await t.store.objects()
        # Not yet the hidden temporary files of puts in progress (file:///).
        frags = stored_fragments({k: v for k, v in objects.items()
                                  if not k.rpartition("/")[2].startswith(".")}, JOURNAL)
        return frags if frags and frags[-1][0].end == end else None

    return await eventually(stored, f"the store to hold {JOURNAL} up to offset {end}")


async def fragments_are_persisted(t: Tutorial) -> None:
    """Within a flush interval or two of the last append, every fragment is persisted:
    gazctl lists them, and the store holds them, named by offsets and SHA-1, each holding
    exactly those bytes of the journal."""
    content = t.content
    await wait_stored(t, len(content))

    async def persisted() -> list[dict[str, Any]] | None:
        out, _ = await t.ok("journals", "fragments", "-l", f"name={JOURNAL}",
                            "--format", "json")
        frags = [json.loads(line) for line in out.splitlines()]
        # Always contiguous from 0 to the write head, persisted or not.
        assert [f["begin"] for f in frags] == [0] + [f["end"] for f in frags[:-1]], frags
        assert frags[-1]["end"] == len(content), frags
        if all(f["backing_store"] == t.store.url and f["mod_time"] for f in frags):
            return frags
        return None

    frags = await eventually(persisted, "every fragment to be persisted", interval=0.2)
    for f in frags:
        assert f["journal"] == JOURNAL and f["compression_codec"] == "SNAPPY"
        assert f["sha1"] == hashlib.sha1(content[f["begin"]:f["end"]]).hexdigest()

    # The tutorial's table.
    header, rows = table_rows((await t.ok("journals", "fragments", "-l",
                                          f"name={JOURNAL}"))[0])
    assert header == ["JOURNAL", "OFFSET", "LENGTH", "PERSISTED", "SHA1", "COMPRESSION"]
    assert [r[:3] for r in rows] == [[JOURNAL, str(f["begin"]), f"{f['end'] - f['begin']} B"]
                                     for f in frags]
    assert all(r[3] == "now" or re.fullmatch(r"\d+ seconds? ago", r[3]) for r in rows), rows
    assert [r[4] for r in rows] == [f["sha1"][:12] + "..." for f in frags]
    assert {r[5] for r in rows} == {"SNAPPY"}

    # The store itself: exactly these fragments, under the names gazctl gave.
    objects = await t.store.objects()
    assert sorted(objects) == [f["path"] for f in frags]
    stored = stored_fragments(objects, JOURNAL)
    assert [(f.begin, f.end) for f, _ in stored] == [(f["begin"], f["end"]) for f in frags]
    for frag, frag_content in stored:
        assert frag.codec is CompressionCodec.SNAPPY
        assert frag_content == content[frag.begin:frag.end]


async def apply_gzip(t: Tutorial) -> tuple[str, int, int]:
    """The tutorial's switch to GZIP: list --format yaml (with its revision), edit, apply.
    Returns the YAML applied, its revision and the revision it was applied at."""
    listed, _ = await t.ok("journals", "list", "--format", "yaml", "-l", f"name={JOURNAL}")
    revision = yaml.safe_load(listed)["revision"]
    assert re.search(rf"(?m)^revision: {revision}$", listed), listed
    assert "compression_codec: SNAPPY" in listed and t.store.url in listed
    gzip_yaml = listed.replace("compression_codec: SNAPPY", "compression_codec: GZIP")
    _, err = await t.ok("journals", "apply", stdin=gzip_yaml.encode())
    match = re.search(r"successfully applied revision=(\d+)", err)
    assert match is not None, err
    applied = int(match[1])
    assert applied > revision
    return gzip_yaml, revision, applied


async def specs_and_revisions(t: Tutorial) -> None:
    """Applies are guarded by revisions (the same YAML twice: the second is stale);
    edit runs $EDITOR and applies what it saved."""
    gzip_yaml, revision, applied = await apply_gzip(t)
    code, _, err = await t.gazctl("journals", "apply", stdin=gzip_yaml.encode())
    assert code == 1, err
    assert err.strip() == (
        f"gazctl: not applied: the spec of {JOURNAL} changed since revision {revision} (it is "
        f"now at revision {applied}); list the journals again and re-apply your changes")
    await t.put("--data-binary", '{"Msg": "Compressed with GZIP"}\n', t.url)

    _, err = await t.ok("journals", "edit", "-l", f"name={JOURNAL}",
                        env={"EDITOR": "sed -i s/GZIP/ZSTANDARD/"})
    assert "successfully applied revision=" in err, err
    listed, _ = await t.ok("journals", "list", "--format", "yaml", "-l", f"name={JOURNAL}")
    spec = yaml.safe_load(listed)
    assert spec["fragment"]["compression_codec"] == "ZSTANDARD"
    assert spec["revision"] > applied
    await t.put("--data-binary", '{"Msg": "Compressed with ZSTANDARD"}\n', t.url)
    await t.read_all()


async def apply_foobar(t: Tutorial) -> None:
    _, err = await t.ok("journals", "apply",
                        stdin=with_store(FOOBAR_TREE_YAML, t.store.url).encode())
    assert "successfully applied revision=" in err, err
    await wait_primaries(t, [JOURNAL, *FOOBAR])


async def selectors(t: Tutorial) -> None:
    results = await asyncio.gather(*(t.ok("journals", "list", "-l", selector)
                                      for selector, _ in TUTORIAL_SELECTIONS))
    for (selector, expected), (out, _) in zip(TUTORIAL_SELECTIONS, results, strict=True):
        header, rows = table_rows(out)
        assert header == ["NAME"] and rows == [[name] for name in expected], selector


async def stop_persists_everything(t: Tutorial) -> None:
    """SIGTERM: the broker rolls its spools, persists them and exits 0; the store then
    holds the whole journal."""
    content = await t.read_all()
    t.broker.proc.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(t.broker.proc.wait(), 60)
    log = t.broker.log_tail(1 << 20)
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]

    objects = await t.store.objects()
    assert all(key.startswith(f"{JOURNAL}/") for key in objects), sorted(objects)
    stored = stored_fragments(objects, JOURNAL)
    assert [f.begin for f, _ in stored] == [0] + [f.end for f, _ in stored[:-1]]
    assert b"".join(c for _, c in stored) == content
    # Codecs the spec had, in the order it had them (each one that saw an append).
    order = [CompressionCodec.SNAPPY, CompressionCodec.GZIP, CompressionCodec.ZSTANDARD]
    codecs = [f.codec for f, _ in stored]
    assert codecs[0] is CompressionCodec.SNAPPY
    assert codecs == sorted(codecs, key=order.index), codecs


@pytest.mark.timeout(180)
async def test_the_broker_tutorial(broker: Broker, store: Store, home: Path) -> None:
    t = Tutorial(broker, store, home)
    await apply_example_journal(t)
    await first_appends_and_reads(t)
    await concurrent_appends(t)
    await streaming_read(t)
    await gazctl_read(t)
    await fragments_are_persisted(t)
    await specs_and_revisions(t)
    await apply_foobar(t)
    await selectors(t)
    await stop_persists_everything(t)


@pytest.mark.parametrize("store", ["file"], indirect=True)
@pytest.mark.timeout(120)
async def test_a_changed_codec_applies_to_the_next_fragment(broker: Broker, store: Store,
                                                            home: Path) -> None:
    """The tutorial's switch from SNAPPY to GZIP, made when every fragment is persisted
    (the spool is empty): the next append starts a GZIP fragment."""
    t = Tutorial(broker, store, home)
    await apply_example_journal(t)
    await first_appends_and_reads(t)
    await wait_stored(t, len(t.content))  # flushed: the spool is empty
    await apply_gzip(t)
    await t.put("--data-binary", '{"Msg": "Compressed with GZIP"}\n', t.url)
    out, _ = await t.ok("journals", "fragments", "-l", f"name={JOURNAL}", "--format", "json")
    last = json.loads(out.splitlines()[-1])
    assert last["begin"] == len(t.content)  # the append started a fragment
    assert last["compression_codec"] == "GZIP", last
