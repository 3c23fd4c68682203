"""Hostile input at the broker's data path (``--broker.data-port``, issue 39), with the
wire suite's summary lines (``fuzz <case>: N inputs, M served wrongly``), against a
``gazette serve`` process:

1. `data-malformed`: seeded streams of APPEND frames, valid and mutated (bytes flipped,
   replaced, inserted, cut; lengths that lie or pass the limit; unknown kinds and
   flags; CHAINED after a refusal; a broken preface or HELLO), each on a connection of
   its own that the client half-closes. An oracle reads each stream as the protocol
   says (`gazette.protocol.frames`) and predicts every answer, in order: APPENDED for a
   whole, valid append, FAILED DATA_LOSS for a bad CRC-32, FAILED ABORTED for a CHAINED
   append after one that did not commit, then GOAWAY INVALID_ARGUMENT at the first
   malformed frame (or a frame the connection ended inside), and nothing after it.
   Served wrongly: any other answer, a missing or extra one, no end within the
   deadline, a connection reset rather than closed (a reset can lose the answers: the
   broker reads and drops what follows a GOAWAY before it closes); and afterwards, a
   journal byte that is not exactly what an APPENDED answer said it committed where it
   said.
2. `data-flood`: 10,000 appends of 4 KiB (40 MB) pipelined on one connection by a
   client that reads no answer meanwhile (a small receive buffer): the broker reads
   ahead only a bounded number of appends, so its memory stays bounded; once read,
   every append is answered, in order, and committed.
3. `data-idle`: 1,000 data connections opened in a burst and left idle after READY:
   memory bounded, and a normal append on the data path meanwhile is answered at once.

Each case ends, as the wire suite's do, with the broker alive, no traceback logged, and
a normal append and read over gRPC and HTTP.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import grpc
import pytest

from gazette.local.etcd import EmbeddedEtcd
from gazette.pb import broker_pb2 as pb
from gazette.protocol import frames
from gazette.protocol.frames import FrameError, Kind
from tests.fixtures.fuzz import DEADLINE, mutate, watched
from tests.fixtures.procs import free_port
from tests.fixtures.wire import BrokerProcess, append_frame, broker_process, raise_fd_limit

pytestmark = pytest.mark.integration

SPECS = """
name: fuzz/
replication: 1
fragment: {stores: ["file:///"], length: 8388608, flush_interval: 1h}
children:
  - name: fuzz/data
  - name: fuzz/check
"""
JOURNAL, CHECK = "fuzz/data", "fuzz/check"
INPUTS = 600
#: gRPC codes as frames carry them.
INVALID_ARGUMENT, ABORTED, DATA_LOSS = 3, 10, 15


@dataclass
class DataBroker:
    process: BrokerProcess
    data_port: int


@pytest.fixture(scope="module")
def broker(etcd_server: EmbeddedEtcd, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[DataBroker]:
    raise_fd_limit()
    port = free_port()
    with broker_process(etcd_server, tmp_path_factory.mktemp("data-fuzz"), SPECS,
                        "--broker.data-port", str(port)) as proc:
        yield DataBroker(proc, port)


async def still_serving(broker: DataBroker) -> float:
    """A normal append and read over gRPC and over HTTP, and one on the data path."""
    start = time.monotonic()
    line = f'{{"at": {start}}}\n'.encode()
    async with asyncio.timeout(DEADLINE):
        async with grpc.aio.insecure_channel(broker.process.grpc_address) as channel:
            append = channel.unary_unary("/gazette.broker.Journal/AppendWhole",
                                         request_serializer=pb.AppendRequest.SerializeToString,
                                         response_deserializer=pb.AppendResponse.FromString)
            resp = await append(pb.AppendRequest(journal=CHECK, content=line))
            assert resp.status == pb.OK, pb.Status.Name(resp.status)
        async with aiohttp.ClientSession() as http:
            url = f"{broker.process.http_url}/{CHECK}"
            async with http.put(url, data=line) as r:
                assert r.status == 204, await r.text()
                begin = r.headers["X-Gazette-Commit-Begin"]
            async with http.get(f"{url}?offset={begin}&block=false") as r:
                assert r.status == 200 and await r.read() == line
        answers = await converse(broker, frames.hello(""), append_frame(CHECK, line))
        assert [k for k, _ in answers.frames] == [Kind.READY, Kind.APPENDED], answers
    return time.monotonic() - start


def case(broker: DataBroker) -> contextlib.AbstractAsyncContextManager[dict[str, float]]:
    return watched(broker.process, lambda: still_serving(broker))


# -- a connection, and what it got back ---------------------------------------------------


@dataclass
class Answers:
    frames: list[tuple[Kind, bytes]] = field(default_factory=list)
    ended: bool = False  # the broker closed the connection (EOF)
    error: str = ""  # a malformed answer, or no end within the deadline
    reset: str = ""  # the connection was reset (not closed)


async def converse(broker: DataBroker, opening: bytes, stream: bytes,
                   timeout: float = DEADLINE) -> Answers:
    """Send `opening` (preface and HELLO), then `stream`, half-close, and read every
    answer frame until the broker closes the connection."""
    out = Answers()
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.data_port)
    try:
        async with asyncio.timeout(timeout):
            writer.write(opening + stream)
            try:
                await writer.drain()
                writer.write_eof()
            except OSError:
                pass  # it ended the connection before reading all: read what it said
            while True:
                try:
                    head = await reader.readexactly(frames.HEADER.size)
                except asyncio.IncompleteReadError as err:
                    if err.partial:
                        out.error = f"a header cut after {len(err.partial)} bytes"
                    out.ended = True
                    return out
                except OSError as err:  # (a reset: what it sent before may be lost)
                    out.ended, out.reset = True, str(err)
                    return out
                try:
                    kind, length, _ = frames.parse_header(head, 1 << 20)
                except FrameError as err:
                    out.error = f"a malformed answer: {err}"
                    return out
                out.frames.append((kind, await reader.readexactly(length)))
    except TimeoutError:
        out.error = f"no end in {timeout:g} s"
    except asyncio.IncompleteReadError:
        out.error = "an answer cut short"
    finally:
        writer.close()
    return out


# -- 1. malformed and mutated streams ------------------------------------------------------


@dataclass
class Input:
    opening: bytes
    stream: bytes
    how: str


def generate(rnd: random.Random, n: int) -> list[Input]:
    """`n` inputs: a few valid appends each (sizes up to past the body buffer's first
    128 KiB), most then mutated once."""
    out: list[Input] = []
    for _ in range(n):
        parts = [append_frame(JOURNAL, rnd.randbytes(rnd.choice([1, 17, 900, 4096, 200_000])),
                              chained=rnd.random() < 0.3)
                 for _ in range(rnd.randint(1, 4))]
        opening, stream, how = frames.hello(""), b"".join(parts), "valid"
        roll = rnd.random()
        if roll < 0.05:
            opening, how = mutate(rnd, opening, [opening]), "opening mutated"
        elif roll < 0.6:
            stream, how = mutate(rnd, stream, parts), "bytes mutated"
        elif roll < 0.85:
            stream, how = lying_header(rnd, parts), "a header changed"
        elif roll < 0.95:
            i = rnd.randrange(len(parts))  # a bad CRC-32 (a content byte flipped)
            bad = bytearray(parts[i])
            bad[-1] ^= 0x40
            parts[i] = bytes(bad)
            stream, how = b"".join(parts), "content changed"
        out.append(Input(opening, stream, how))
    return out


def lying_header(rnd: random.Random, parts: list[bytes]) -> bytes:
    """One frame's length, kind, flags or reserved bytes changed."""
    i = rnd.randrange(len(parts))
    frame = bytearray(parts[i])
    length, kind, flags = frames.HEADER.unpack_from(frame)
    what = rnd.randrange(4)
    if what == 0:
        length = rnd.choice([0, 1, 7, length - 1, length + 1, length + 1000,
                             frames.DEFAULT_MAX_BODY, frames.DEFAULT_MAX_BODY + 1,
                             2**31, 2**32 - 1])
    elif what == 1:
        kind = rnd.choice([0, int(Kind.HELLO), int(Kind.READY), int(Kind.APPENDED),
                           int(Kind.FAILED), int(Kind.GOAWAY), 7, 255])
    elif what == 2:
        flags = rnd.choice([0, 1, 2, 0x80, 0xFF])
    frames.HEADER.pack_into(frame, 0, length, kind, flags)
    if what == 3:
        frame[6 + rnd.randrange(2)] = rnd.randrange(1, 256)
    parts[i] = bytes(frame)
    return b"".join(parts)


@dataclass
class Committed:
    begin: int
    end: int
    content: bytes


def judge(inp: Input, got: Answers, max_body: int, committed: list[Committed]) -> str:
    """Why `got` is not what the protocol says `inp` gets ("" if it is); the appends it
    committed go to `committed`."""
    if got.error:
        return got.error
    if got.reset:  # (the broker lingers after a GOAWAY: a reset could lose it)
        return f"the connection was reset, not closed ({got.reset})"
    answers = collections.deque(got.frames)
    if inp.opening != frames.hello(""):
        # A mutated opening: GOAWAY, or a plain close if the HELLO never completed;
        # READY only if it still is a valid preface and HELLO (a token, with tokens off).
        if answers and answers[0][0] is Kind.READY:
            answers.popleft()
        else:
            kinds = [k for k, _ in answers]
            return "" if kinds in ([], [Kind.GOAWAY]) else \
                f"answers {[k.name for k in kinds]} to a broken opening"
    elif not answers or answers.popleft()[0] is not Kind.READY:
        return "no READY to a valid opening"
    if answers and answers[0][0] is Kind.READY:
        return "a second READY"
    stream, pos, last_committed = inp.stream, 0, None
    while pos < len(stream):
        head = stream[pos:pos + frames.HEADER.size]
        try:
            if len(head) < frames.HEADER.size:
                raise FrameError("frame", "the connection ended inside a header")
            kind, length, flags = frames.parse_header(head, max_body)
            if kind is not Kind.APPEND:
                raise FrameError("frame.kind", kind.name)
            body = stream[pos + len(head):pos + len(head) + length]
            if len(body) < length:
                raise FrameError("frame", "the connection ended inside a body")
            append = frames.parse_append(body, flags)
        except FrameError as err:
            return expect_goaway(answers, str(err))
        pos += len(head) + length
        if not answers:
            return f"no answer to the append at byte {pos - length}"
        kind, body = answers.popleft()
        content = bytes(append.content)
        if append.chained and last_committed is False:
            if (kind, code_of(body)) != (Kind.FAILED, ABORTED):
                return f"{kind.name} ({describe(kind, body)}) to a CHAINED append after a " \
                       "refusal, not FAILED ABORTED"
            last_committed = False
            continue
        if zlib.crc32(content) != append.crc:
            if (kind, code_of(body)) != (Kind.FAILED, DATA_LOSS):
                return f"{kind.name} ({describe(kind, body)}) to a bad CRC-32, not " \
                       "FAILED DATA_LOSS"
            last_committed = False
            continue
        exact = append.request == pb.AppendRequest(journal=JOURNAL)
        if kind is Kind.APPENDED:
            resp = frames.parse_appended(body)
            ok = resp.status == pb.OK
            if exact and not ok:
                return f"a valid append answered {pb.Status.Name(resp.status)}"
            if ok:
                if resp.commit.journal != append.request.journal or \
                        resp.commit.end - resp.commit.begin != len(content):
                    return f"a commit {resp.commit} for {len(content)} bytes"
                if resp.commit.journal == JOURNAL:
                    committed.append(Committed(resp.commit.begin, resp.commit.end, content))
            last_committed = ok
        elif kind is Kind.FAILED:
            if exact:
                return f"a valid append refused: {describe(kind, body)}"
            last_committed = False
        else:
            return f"{kind.name} ({describe(kind, body)}) where an append's answer belongs"
    if answers:
        return f"{len(answers)} answers more than appends: {[k.name for k, _ in answers]}"
    return "" if got.ended else "the connection was not closed"


def expect_goaway(answers: collections.deque[tuple[Kind, bytes]], why: str) -> str:
    if [k for k, _ in answers] != [Kind.GOAWAY]:
        return f"{[k.name for k, _ in answers]} where GOAWAY belongs ({why})"
    code = code_of(answers[0][1])
    return "" if code == INVALID_ARGUMENT else f"GOAWAY {code}, not INVALID_ARGUMENT ({why})"


def code_of(body: bytes) -> int:
    try:
        return frames.parse_refusal(body)[0]
    except FrameError:
        return -1


#: gRPC status names by code.
CODES = {c.value[0]: c.name for c in grpc.StatusCode}


def describe(kind: Kind, body: bytes) -> str:
    if kind in (Kind.FAILED, Kind.GOAWAY):
        code, detail = frames.parse_refusal(body)
        return f"{kind.name} {CODES.get(code, code)}: {detail[:80]}"
    if kind is Kind.APPENDED:
        return pb.Status.Name(frames.parse_appended(body).status)
    return f"{len(body)} bytes"


async def read_journal(broker: DataBroker, end: int) -> bytes:
    out = bytearray()
    async with grpc.aio.insecure_channel(broker.process.grpc_address) as channel:
        read = channel.unary_stream("/gazette.broker.Journal/Read",
                                    request_serializer=pb.ReadRequest.SerializeToString,
                                    response_deserializer=pb.ReadResponse.FromString)
        async for resp in read(pb.ReadRequest(journal=JOURNAL, offset=0, end_offset=end)):
            out += resp.content
    return bytes(out)


async def test_malformed_and_mutated_frames(broker: DataBroker,
                                            report: Callable[..., None]) -> None:
    inputs = generate(random.Random(39), INPUTS)
    async with case(broker) as info:
        ready = await converse(broker, frames.hello(""), b"")
        assert ready.frames and ready.frames[0][0] is Kind.READY, ready
        max_body = frames.parse_ready(ready.frames[0][1])
        committed: list[Committed] = []
        wrong: list[str] = []
        outcomes: collections.Counter[str] = collections.Counter()
        gate = asyncio.Semaphore(16)

        async def one(inp: Input) -> None:
            async with gate:
                got = await converse(broker, inp.opening, inp.stream)
            for kind, body in got.frames:
                outcomes[describe(kind, body).split(":")[0] if kind is not Kind.READY
                         else "READY"] += 1
            outcomes["(reset)"] += bool(got.reset)
            why = judge(inp, got, max_body, committed)
            if why:
                wrong.append(f"{inp.how} {inp.stream[:48].hex()}...: {why}")

        await asyncio.gather(*(one(inp) for inp in inputs))
        # Nothing but what was acknowledged, each where its answer said.
        end = max((c.end for c in committed), default=0)
        journal = await read_journal(broker, end) if end else b""
        for c in committed:
            if journal[c.begin:c.end] != c.content:
                wrong.append(f"the journal at [{c.begin}, {c.end}) is not what was "
                             "acknowledged there")
        if sum(c.end - c.begin for c in committed) != len(journal):
            wrong.append(f"the journal holds {len(journal)} bytes, appends acknowledged "
                         f"{sum(c.end - c.begin for c in committed)}")
        hows = collections.Counter(i.how for i in inputs)
        report("data-malformed", len(inputs), len(wrong),
               f"{', '.join(f'{h} {n}' for h, n in hows.most_common())}; answers "
               f"{', '.join(f'{k} {n}' for k, n in outcomes.most_common(8))}; "
               f"{len(committed)} appends committed, {len(journal)} bytes checked; "
               f"{time.monotonic() - info['start']:.1f}s")
    assert not wrong, "\n".join(wrong[:20])


# -- 2. a flood that reads no answer -------------------------------------------------------


FLOOD = 10_000


async def test_a_flood_of_pipelined_appends_read_late(broker: DataBroker,
                                                      report: Callable[..., None]) -> None:
    async with case(broker) as info:
        lines = [f"flood {i:05d} ".encode() + b"x" * 4000 + b"\n" for i in range(FLOOD)]
        # A small receive buffer: the answers back up at once, as at a client that
        # stopped reading.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", broker.data_port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        try:
            writer.write(frames.hello(""))
            kind, length, _ = frames.parse_header(await reader.readexactly(8), 1 << 20)
            assert kind is Kind.READY
            await reader.readexactly(length)
            sent = 0

            async def send() -> None:
                nonlocal sent
                for line in lines:
                    writer.write(append_frame(JOURNAL, line, chained=True))
                    sent += 1
                    if sent % 500 == 0:
                        await writer.drain()  # (blocks once the broker stops reading)
                await writer.drain()

            sending = asyncio.create_task(send())
            # The broker reads ahead a bounded number of appends; its answers wait in
            # the sockets' buffers (which hold ~1 MB of them here: it may take all).
            await asyncio.wait({sending}, timeout=3)
            sent_then, rss_then = sent, broker.process.rss_mib()
            answers: list[pb.AppendResponse] = []
            async with asyncio.timeout(60):
                while len(answers) < FLOOD:
                    kind, length, _ = frames.parse_header(await reader.readexactly(8), 1 << 20)
                    body = await reader.readexactly(length)
                    assert kind is Kind.APPENDED, describe(kind, body)
                    answers.append(frames.parse_appended(body))
                await sending
        finally:
            writer.close()
        wrong = [f"append {i}: {pb.Status.Name(a.status)}" for i, a in enumerate(answers)
                 if a.status != pb.OK]
        begins = [a.commit.begin for a in answers]
        if begins != sorted(begins):
            wrong.append("answers out of order")
        growth = rss_then - info["rss"]
        if growth > 64:
            wrong.append(f"the broker grew {growth:.0f} MiB while answers waited")
        report("data-flood", FLOOD, len(wrong),
               f"{sent_then} of {FLOOD} sent in 3 s with no answer read; broker "
               f"+{growth:.0f} MiB then (ceiling 64); all answered in order; "
               f"{time.monotonic() - info['start']:.1f}s")
    assert not wrong, "\n".join(wrong[:20])


# -- 3. idle connections -------------------------------------------------------------------


IDLE = 1000


async def test_idle_data_connections(broker: DataBroker, report: Callable[..., None]
                                     ) -> None:
    async with case(broker) as info:
        conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        wrong: list[str] = []
        try:
            async def open_one() -> None:
                reader, writer = await asyncio.open_connection("127.0.0.1", broker.data_port)
                conns.append((reader, writer))
                writer.write(frames.hello(""))
                kind, length, _ = frames.parse_header(await reader.readexactly(8), 1 << 20)
                await reader.readexactly(length)
                if kind is not Kind.READY:
                    wrong.append(f"{kind.name} to a connection of the burst")

            async with asyncio.timeout(30):
                await asyncio.gather(*(open_one() for _ in range(IDLE)))
            growth = broker.process.rss_mib() - info["rss"]
            started = time.monotonic()
            got = await converse(broker, frames.hello(""), append_frame(JOURNAL, b"meanwhile\n"))
            took = time.monotonic() - started
            if [k for k, _ in got.frames] != [Kind.READY, Kind.APPENDED]:
                wrong.append(f"a normal append meanwhile: {got}")
            if growth > 96:
                wrong.append(f"the broker grew {growth:.0f} MiB for {IDLE} idle connections")
        finally:
            for _, writer in conns:
                writer.close()
        report("data-idle", IDLE, len(wrong),
               f"{IDLE} idle data connections: broker +{growth:.0f} MiB (ceiling 96); an "
               f"append meanwhile took {took:.2f}s")
    assert not wrong, "\n".join(wrong[:20])


def test_the_oracle_refuses_what_it_should() -> None:
    """The judge itself: a right answer passes, each kind of wrong one is named."""
    line = append_frame(JOURNAL, b"x\n")
    inp = Input(frames.hello(""), line, "valid")
    ready = (Kind.READY, frames.ready(1 << 20)[8:])
    resp = pb.AppendResponse(status=pb.OK, commit=pb.Fragment(journal=JOURNAL, begin=0, end=2))
    ok = (Kind.APPENDED, frames.appended(resp)[8:])
    assert judge(inp, Answers([ready, ok], ended=True), 1 << 20, []) == ""
    assert "no answer" in judge(inp, Answers([ready], ended=True), 1 << 20, [])
    refused = (Kind.FAILED, frames.refusal(Kind.FAILED, 13, "boom")[8:])
    assert "valid append refused" in judge(inp, Answers([ready, refused], ended=True),
                                           1 << 20, [])
    bad = bytearray(line)
    bad[-1] ^= 1
    assert "bad CRC-32" in judge(Input(frames.hello(""), bytes(bad), "c"),
                                 Answers([ready, ok], ended=True), 1 << 20, [])
    goaway = (Kind.GOAWAY, frames.refusal(Kind.GOAWAY, 3, "bad")[8:])
    cut = Input(frames.hello(""), line[:-1], "cut")
    assert judge(cut, Answers([ready, goaway], ended=True), 1 << 20, []) == ""
    assert "where GOAWAY belongs" in judge(cut, Answers([ready, ok], ended=True), 1 << 20, [])
