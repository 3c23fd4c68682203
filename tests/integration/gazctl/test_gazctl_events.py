"""`gazctl events` against a real broker: create-topic (then `journals list` shows the
partitions; again is fine; bad input is exit 2), and dead-letters and replay over a
dead-letter journal written as a consumer group writes it (`_Failures`, in consumer
transactions): a committed transaction's dead letters show, a rolled-back one's and a
still-open one's do not; replay appends exactly the chosen ones to the retry journal,
and a second run from the printed offset appends nothing.

Most commands run `run_async()` on the test's event loop; usage errors run `gazctl` as a
process (argparse writes them to the process's own stderr).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from gazette.client import AppendQueue, JournalClient
from gazette.events import Event, Handler, Kind, OnFailure, Topic
from gazette.events.group import _Failures
from gazette.events.handlers import Item
from gazette.events.topic import DEAD, RETRY, group_journal, group_journal_spec
from gazette.gazctl.__main__ import run_async
from gazette.message import Publisher, Sequencer
from gazette.protocol import SpecChange
from gazette_broker import BrokerServer
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.events import Order, committed_lines, new_events
from tests.fixtures.polling import eventually
from tests.fixtures.procs import run_process

pytestmark = pytest.mark.integration

GAZCTL = str(Path(sys.executable).parent / "gazctl")
GROUP = "billing"
DEAD_JOURNAL = group_journal("orders", GROUP, DEAD)
RETRY_JOURNAL = group_journal("orders", GROUP, RETRY)


def _env(server: BrokerServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("BROKER_ADDRESS", "LOG_LEVEL", "LOG_FORMAT")}
    env["BROKER_ADDRESS"] = f"http://{server.grpc_address}"
    return env


async def inproc(server: BrokerServer, *args: str) -> tuple[int, str, str]:
    """gazctl in this process: (exit status, stdout, stderr)."""
    out, err = io.BytesIO(), io.StringIO()
    code = await run_async(list(args), stdout=out, stderr=err, env=_env(server))
    return code, out.getvalue().decode(), err.getvalue()


async def process(server: BrokerServer, *args: str) -> tuple[int, str, str]:
    code, out, err = await run_process([GAZCTL, *args], _env(server), timeout=60)
    return code, out.decode(), err


def rows(table_text: str) -> list[list[str]]:
    """The cells of a table's rows (without its header)."""
    return [[c.strip() for c in line.split("|")[1:-1]]
            for line in table_text.splitlines()[3:] if line.startswith("|")]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def next_offset(out: str) -> int:
    found = re.findall(r"next: --offset (\d+)", out)
    assert len(found) == 1, out
    return int(found[0])


async def test_create_topic(broker_server: BrokerServer) -> None:
    server = broker_server
    code, out, err = await inproc(server, "events", "create-topic", "orders",
                                  "--partitions", "3")
    assert code == 0, err
    parts = [f"events/orders/part-{i:03d}" for i in range(3)]
    assert out.splitlines() == parts
    code, out, err = await inproc(server, "journals", "list", "-l",
                                  "events.gazette.dev/topic=orders", "-L", "content-type")
    assert code == 0, err
    assert rows(out) == [[p, "application/x-ndjson"] for p in parts]

    # Again: nothing to do. More partitions: only the missing ones, with a warning.
    code, out, err = await inproc(server, "events", "create-topic", "orders",
                                  "--partitions", "3")
    assert (code, out) == (0, ""), err
    assert "nothing to create" in err and "partitions=3" in err
    code, out, err = await inproc(server, "events", "create-topic", "orders",
                                  "--partitions", "5", "--replication", "1")
    assert code == 0, err
    assert out.splitlines() == ["events/orders/part-003", "events/orders/part-004"]
    assert "some keys now map to another partition" in err
    code, out, _ = await inproc(server, "journals", "list", "-l",
                                "events.gazette.dev/topic=orders")
    assert len(rows(out)) == 5

    # Another prefix and store.
    code, out, err = await inproc(server, "events", "create-topic", "clicks", "--prefix",
                                  "ev2/", "--partitions", "1", "--fragment-store",
                                  "file:///clicks/")
    assert (code, out) == (0, "ev2/clicks/part-000\n"), err


async def test_create_topic_bad_input_is_exit_2(broker_server: BrokerServer) -> None:
    server = broker_server
    for args, message in [
        (["bad/name"], "argument NAME: bad topic name: 'bad/name' has invalid character '/'"),
        (["_x"], "argument NAME: bad topic name: '_x' must begin with a letter or digit"),
        (["ok", "--partitions", "0"], "argument --partitions: must be at least 1, got 0"),
        (["ok", "--partitions", "1025"], "must be at most 1024, got 1025"),
        (["ok", "--prefix", "events"], "argument --prefix: 'events' must end with '/'"),
    ]:
        code, out, err = await process(server, "events", "create-topic", *args)
        assert code == 2 and out == "", (args, err)
        assert message in one_line(err), args
    code, _, err = await inproc(server, "events", "create-topic", "ok",
                                "--fragment-store", "ftp://nowhere/")
    assert code == 2 and "create-topic:" in one_line(err) and "ftp://nowhere/" in err
    code, out, _ = await inproc(server, "journals", "list", "-l", "prefix=events/")
    assert rows(out) == []  # nothing was created


async def noop(event: Any) -> None:
    pass


def _handler(name: str, topic: Topic[Order]) -> Handler:
    return Handler(name, topic, noop, Kind.IDEMPOTENT, OnFailure.SAVE)


async def test_dead_letters_and_replay(broker_server: BrokerServer) -> None:
    server = broker_server
    async with JournalClient(server.grpc_address) as client, \
            AppendQueue(client, resend=True) as queue:
        await client.apply([SpecChange(s.name, 0, s) for s in (
            group_journal_spec("orders", GROUP, role) for role in (RETRY, DEAD))])
        await asyncio.wait_for(server.broker.wait_serving({DEAD_JOURNAL, RETRY_JOURNAL}), 10)

        # Dead letters as a shard of the group writes them, in consumer transactions.
        topic = Topic("orders", Order)
        email, audit = _handler("email", topic), _handler("audit", topic)
        publisher = Publisher(queue)
        failures = _Failures(publisher, GROUP, "events/")

        def fail(handler: Handler, event_id: str, error: str, attempt: int) -> None:
            line = topic.new_line(Order(id=len(event_id), customer="c"), event_id=event_id)
            failures.dead(handler, Item(dict(line), "events/orders/part-000", 7), error,
                          attempt)

        async def commit() -> bytes:
            (intent,) = publisher.build_ack_intents()
            await queue.append(intent.journal, intent.data)
            return intent.data

        # A committed transaction of two dead letters.
        fail(email, "ev-1", "ValueError: no\n such address " + "x" * 100, 1)
        fail(audit, "ev-2", "TimeoutError: slow", 5)
        ack = await commit()
        # A failed transaction: its shard recovered and wrote its last ACK again.
        fail(email, "ev-rolled-back", "KeyError: rolled back", 1)
        await queue.append(DEAD_JOURNAL, ack)
        # A transaction still open.
        fail(audit, "ev-open", "OSError: open", 1)
        await queue.flush()
        raw = [d["id"] for d in await read_lines(client, DEAD_JOURNAL) if "id" in d]
        assert raw == ["ev-1", "ev-2", "ev-rolled-back", "ev-open"]  # all in the journal

        code, out, err = await inproc(server, "events", "dead-letters", "--topic", "orders",
                                      "--group", GROUP)
        assert code == 0, err
        table = rows(out)
        assert [r[1:4] for r in table] == [["ev-1", "email", "1"], ["ev-2", "audit", "5"]]
        assert table[0][4] == "ValueError: no such address " + "x" * 29 + "..."
        assert table[1][4] == "TimeoutError: slow"
        head = next_offset(out)
        assert head == await client.write_head(DEAD_JOURNAL)
        assert out.splitlines()[-1] == (f"2 dead letter(s) in {DEAD_JOURNAL} from offset 0; "
                                        f"next: --offset {head}")
        # The open transaction is named, with the offset to read it from should it commit.
        warned = re.findall(r"should they commit, --offset (\d+) reads them", err)
        assert len(warned) == 1, err
        open_at = int(warned[0])

        code, out, err = await inproc(server, "events", "dead-letters", "--topic", "orders",
                                      "--group", GROUP, "--format", "json")
        assert code == 0, err
        letters = [json.loads(line) for line in out.splitlines()]
        assert [(d["id"], d["handler"], d["data"]) for d in letters] == [
            ("ev-1", "email", {"id": 4, "customer": "c", "amount": 0}),
            ("ev-2", "audit", {"id": 4, "customer": "c", "amount": 0})]
        assert [d["offset"] for d in letters] == [int(r[0]) for r in table]
        assert letters[0]["offset"] == 0 and letters[0]["source"] == "events/orders/part-000@7"
        assert all("uuid" not in d for d in letters)
        assert f"next_offset={head}" in err

        # Committed messages that left the Sequencer's ring are read again: the same.
        made: list[Sequencer] = []

        def small_ring() -> Sequencer:
            made.append(Sequencer(buffer=1))
            return made[-1]

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("gazette.message.Sequencer", small_ring)
            code, again, err = await inproc(server, "events", "dead-letters", "--topic",
                                            "orders", "--group", GROUP)
        assert code == 0 and rows(again) == table, err
        assert made[0].replays == 1

        # A dry run shows what it would replay and appends nothing.
        code, out, err = await inproc(server, "events", "replay", "--topic", "orders",
                                      "--group", GROUP, "--handler", "email", "--dry-run")
        assert code == 0, err
        assert [r[1] for r in rows(out)] == ["ev-1"] and "would replay 1 of 2" in out
        assert await client.write_head(RETRY_JOURNAL) == 0

        # Replay the email handler's: exactly that one lands in the retry journal.
        code, out, err = await inproc(server, "events", "replay", "--topic", "orders",
                                      "--group", GROUP, "--handler", "email")
        assert code == 0, err
        assert [r[1] for r in rows(out)] == ["ev-1"] and "replayed 1 of 2" in out
        assert next_offset(out) == head
        (line,) = await read_lines(client, RETRY_JOURNAL)
        assert line.pop("uuid")  # the Publisher's
        assert abs(line.pop("retry_at") - line["time"]) < 60  # now: the event is new
        assert line == {"id": "ev-1", "key": "ev-1", "time": line["time"],
                        "data": {"id": 4, "customer": "c", "amount": 0}, "topic": "orders",
                        "group": GROUP, "handler": "email", "attempt": 0,
                        "source": f"replayed from {DEAD_JOURNAL}@0"}

        # --id picks one event; from the printed offset on, there is nothing to replay.
        code, out, err = await inproc(server, "events", "replay", "--topic", "orders",
                                      "--group", GROUP, "--id", "ev-2")
        assert code == 0 and "replayed 1 of 2" in out, err
        assert [(d["id"], d["attempt"]) for d in await read_lines(client, RETRY_JOURNAL)
                ] == [("ev-1", 0), ("ev-2", 0)]
        code, out, err = await inproc(server, "events", "replay", "--topic", "orders",
                                      "--group", GROUP, "--offset", str(head))
        assert code == 0 and "replayed 0 of 0" in out and next_offset(out) == head, err
        assert rows(out) == [] and len(await read_lines(client, RETRY_JOURNAL)) == 2

        # The open transaction commits: read from where the warning said, it shows.
        await commit()
        code, out, err = await inproc(server, "events", "dead-letters", "--topic", "orders",
                                      "--group", GROUP, "--offset", str(open_at))
        assert code == 0 and "should they commit" not in err, err
        assert [(r[0], r[1]) for r in rows(out)] == [(str(open_at), "ev-open")]

        # Unknown group or topic: one line naming the journal.
        for flags in (["--topic", "orders", "--group", "nobody"],
                      ["--topic", "nothing", "--group", GROUP]):
            for verb in ("dead-letters", "replay"):
                code, out, err = await inproc(server, "events", verb, *flags)
                journal = group_journal(flags[1], flags[3], DEAD)
                assert (code, out) == (1, ""), err
                assert f"the dead-letter journal {journal} does not exist" in one_line(err)
        code, _, err = await inproc(server, "events", "dead-letters", "--topic", "orders",
                                    "--group", GROUP, "--offset", str(head + 1000))
        assert code == 1 and "beyond the write head" in one_line(err)


async def read_lines(client: JournalClient, journal: str) -> list[dict[str, Any]]:
    content = b"".join([bytes(c.content) async for c in client.read(journal, 0)])
    return [json.loads(line) for line in content.splitlines()]


async def test_a_replayed_dead_letter_reaches_its_handler_again(
        broker_server: BrokerServer, etcd_server: EtcdServer, consumer_root: str) -> None:
    """End to end: a topic made by create-topic (the library, not allowed to create
    topics, finds it), a handler's dead letter, replayed to the running group."""
    server = broker_server
    code, _, err = await inproc(server, "events", "create-topic", "orders", "--partitions",
                                "2")
    assert code == 0, err
    events = new_events(server, etcd_server, consumer_root, create_topics=False)
    topic = Topic("orders", Order, partitions=2)
    seen: list[tuple[int, int]] = []
    refuse = {7}

    async def ship(event: Event[Order]) -> None:
        if event.payload.id in refuse:
            refuse.discard(event.payload.id)  # once: the replay then goes through
            raise RuntimeError("warehouse closed")
        seen.append((event.payload.id, event.attempt))

    events.idempotent(GROUP, topic, ship, on_failure=OnFailure.SAVE)

    async with events, JournalClient(server.grpc_address) as client:
        await events.produce(topic, *(Order(id=i, customer="c") for i in range(10)))

        async def saved() -> bool:
            return bool(await committed_lines(client, DEAD_JOURNAL))
        await eventually(saved, "the dead letter of event 7", timeout=30)
        code, out, err = await inproc(server, "events", "dead-letters", "--topic", "orders",
                                      "--group", GROUP)
        assert code == 0, err
        [row] = rows(out)
        assert row[2:] == ["ship", "1", "RuntimeError: warehouse closed"]

        code, out, err = await inproc(server, "events", "replay", "--topic", "orders",
                                      "--group", GROUP)
        assert code == 0 and "replayed 1 of 1" in out, err
        await eventually(lambda: (7, 0) in seen, "the replayed event handled", timeout=30)
        assert sorted(seen) == [(i, 0) for i in range(10)]
        code, out, err = await inproc(server, "events", "replay", "--topic", "orders",
                                      "--group", GROUP, "--offset", str(next_offset(out)))
        assert code == 0 and "replayed 0 of 0" in out, err
        [line] = await committed_lines(client, RETRY_JOURNAL)
        assert (line["data"]["id"], line["handler"], line["attempt"]) == (7, "ship", 0)
