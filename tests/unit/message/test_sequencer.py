"""Sequencer: exactly the committed messages, each once, in per-producer order.

Scenarios are generated with their ground truth: which transactions commit, and where
each commit is first read. Random interleavings of producers, transactions spanning
journals, re-sent appends, rollbacks (a recovered producer re-writing its older ACK),
small ring buffers forcing replays, and restores from checkpointed producer states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gazette.message import uuid as muuid
from gazette.message.base import Envelope
from gazette.message.sequencer import ProducerState, ReplayRequired, Sequencer
from gazette.message.uuid import Flags

JOURNALS = ("events/a", "events/b")
FRAME = 10  # bytes per message in the synthetic journals


@dataclass
class Scenario:
    log: list[Envelope]  # everything read, in order, across journals
    expected: list[tuple[str, int]]  # (journal, uuid) of committed messages, in order
    by_journal: dict[str, list[Envelope]] = field(default_factory=dict)

    def replay(self, journal: str, begin: int, end: int) -> list[Envelope]:
        return [e for e in self.by_journal[journal] if e.begin >= begin and e.end <= end]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n_producers = draw(st.integers(1, 4))
    n_journals = draw(st.integers(1, 2))
    # Per producer: a list of appends, each (journal, [(uuid, flags)], commit_key | None).
    per_producer: list[list[tuple[str, list[int]]]] = []
    commits: dict[tuple[str, int], list[int]] = {}  # (journal, ACK uuid) -> what it commits
    outside: set[tuple[str, int]] = set()
    for p in range(n_producers):
        producer = (1 << 40) | (p + 1)
        clock = muuid.Clock.from_unix(1_700_000_000 + p)
        last_commit: dict[str, int] = {}
        appends: list[tuple[str, list[int]]] = []
        for _ in range(draw(st.integers(0, 5))):
            kind = draw(st.sampled_from(["commit", "commit", "rollback", "outside"]))
            if kind == "outside":
                journal = JOURNALS[draw(st.integers(0, n_journals - 1))]
                clock += 1
                u = muuid.build(producer, clock, Flags.OUTSIDE_TXN)
                outside.add((journal, u))
                last_commit[journal] = clock
                appends.append((journal, [u]))
                continue
            written: dict[str, list[int]] = {}
            for _ in range(draw(st.integers(1, 6))):
                journal = JOURNALS[draw(st.integers(0, n_journals - 1))]
                clock += 1
                written.setdefault(journal, []).append(
                    muuid.build(producer, clock, Flags.CONTINUE_TXN))
            # Messages go out in appends of one to three messages, journal by journal.
            for journal, uuids in written.items():
                i = 0
                while i < len(uuids):
                    n = draw(st.integers(1, 3))
                    appends.append((journal, uuids[i:i + n]))
                    i += n
            if kind == "commit":
                clock += 1
                for journal, uuids in written.items():
                    ack = muuid.build(producer, clock, Flags.ACK_TXN)
                    commits[(journal, ack)] = uuids
                    last_commit[journal] = clock
                    appends.append((journal, [ack]))
            else:  # the producer fails, recovers, and re-writes its last ACK per journal
                for journal in written:
                    ack = muuid.build(producer, last_commit.get(journal, 0), Flags.ACK_TXN)
                    appends.append((journal, [ack]))
        # Re-sent appends: a copy right after the original (before the next append).
        with_dups: list[tuple[str, list[int]]] = []
        for append in appends:
            with_dups.append(append)
            if draw(st.integers(0, 5)) == 0:
                with_dups.append(append)
        per_producer.append(with_dups)

    # Interleave producers randomly, keeping each producer's own order.
    order = [p for p, appends in enumerate(per_producer) for _ in appends]
    order = draw(st.permutations(order))
    cursors = [0] * n_producers
    offsets = dict.fromkeys(JOURNALS, 0)
    log: list[Envelope] = []
    by_journal: dict[str, list[Envelope]] = {j: [] for j in JOURNALS}
    for p in order:
        journal, uuids = per_producer[p][cursors[p]]
        cursors[p] += 1
        for u in uuids:
            env = Envelope(journal, offsets[journal], offsets[journal] + FRAME, {"u": u}, u)
            offsets[journal] += FRAME
            log.append(env)
            by_journal[journal].append(env)

    # Ground truth: a commit is read at the first occurrence of its ACK; an OUTSIDE_TXN
    # message at its first occurrence.
    expected: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()
    for env in log:
        key = (env.journal, env.uuid)
        if key in seen:
            continue
        seen.add(key)
        if key in commits:
            expected.extend((env.journal, u) for u in commits[key])
        elif key in outside:
            expected.append(key)
    return Scenario(log, expected, by_journal)


def sequence(seq: Sequencer, envs: list[Envelope], scenario: Scenario) -> list[Envelope]:
    """Queue each envelope and dequeue all it commits, serving replays from the log."""
    out: list[Envelope] = []
    for env in envs:
        seq.queue(env)
        while True:
            try:
                got = seq.dequeue()
            except ReplayRequired as r:
                seq.start_replay(scenario.replay(r.journal, r.begin, r.end))
                continue
            if got is None:
                break
            out.append(got)
    return out


def keys(envs: list[Envelope]) -> list[tuple[str, int]]:
    return [(e.journal, e.uuid) for e in envs]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(1, 12))
def test_read_committed_is_exactly_the_committed_messages(sc: Scenario, buffer: int) -> None:
    out = keys(sequence(Sequencer(buffer=buffer), sc.log, sc))
    assert out == sc.expected
    assert len(set(out)) == len(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(1, 12), st.data())
def test_restoring_from_producer_states_continues_the_same(
    sc: Scenario, buffer: int, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(sc.log)))
    first = Sequencer(buffer=buffer)
    head = sequence(first, sc.log[:cut], sc)
    states = first.producer_states()
    # Through the checkpoint's own form, as a consumer would store it.
    states = [ProducerState(s.journal, s.producer, s.last_ack, s.begin, s.last_seen)
              for s in states]
    tail = sequence(Sequencer(states, buffer=buffer), sc.log[cut:], sc)
    assert keys(head + tail) == sc.expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(1, 12), st.data())
def test_queue_all_in_batches_is_the_same_as_queue_one_by_one(
    sc: Scenario, buffer: int, data: st.DataObject
) -> None:
    """queue_all inlines the common case (a CONTINUE_TXN message): batches of any size
    give what queueing one at a time gives, counters and checkpoints included."""
    one = Sequencer(buffer=buffer)
    expected = sequence(one, sc.log, sc)
    batched = Sequencer(buffer=buffer)
    out: list[Envelope] = []
    i = 0
    while i < len(sc.log):
        n = data.draw(st.integers(1, 8))
        batched.queue_all(sc.log[i:i + n])
        i += n
        while True:
            try:
                out.extend(batched.drain())
            except ReplayRequired as r:
                batched.start_replay(sc.replay(r.journal, r.begin, r.end))
                continue
            if not batched.ready:
                break
    assert keys(out) == keys(expected) == sc.expected
    assert (batched.duplicates, batched.rolled_back) == (one.duplicates, one.rolled_back)
    assert batched.producer_states() == one.producer_states()


def env(journal: str, offset: int, producer: int, clock: int, flags: Flags) -> Envelope:
    u = muuid.build(producer, clock, flags)
    return Envelope(journal, offset, offset + FRAME, None, u)


def test_no_head_of_line_blocking_across_producers() -> None:
    seq = Sequencer(buffer=16)
    seq.queue(env("j", 0, 1, 100, Flags.CONTINUE_TXN))  # producer 1 stays pending
    seq.queue(env("j", 10, 2, 200, Flags.CONTINUE_TXN))
    seq.queue(env("j", 20, 2, 201, Flags.ACK_TXN))
    assert [e.begin for e in seq.drain()] == [10]
    assert seq.dequeue() is None


def test_replay_names_the_exact_range_of_messages_that_left_the_buffer() -> None:
    seq = Sequencer(buffer=2)
    for i in range(5):
        seq.queue(env("j", i * FRAME, 1, 100 + i, Flags.CONTINUE_TXN))
    seq.queue(env("j", 50, 1, 110, Flags.ACK_TXN))
    with pytest.raises(ReplayRequired) as err:
        seq.dequeue()
    assert (err.value.journal, err.value.begin, err.value.end) == ("j", 0, 30)
    with pytest.raises(RuntimeError):
        Sequencer().start_replay([])


def test_messages_without_uuid_are_delivered_at_least_once() -> None:
    seq = Sequencer()
    plain = Envelope("j", 0, 5, "no uuid", 0)
    seq.queue(plain)
    seq.queue(plain)
    assert seq.drain() == [plain, plain]


def test_producer_states_prune_old_producers() -> None:
    seq = Sequencer()
    old, new = muuid.Clock.from_unix(1000), muuid.Clock.from_unix(2000)
    seq.queue(env("j", 0, 1, old, Flags.OUTSIDE_TXN))
    seq.queue(env("j", 10, 2, new, Flags.OUTSIDE_TXN))
    seq.queue(env("k", 0, 1, old, Flags.CONTINUE_TXN))
    seq.drain()
    assert len(seq.producer_states()) == 3
    states = seq.producer_states(prune_horizon=500)
    assert sorted((s.journal, s.producer, s.begin) for s in states) == [
        ("j", 2, -1), ("k", 1, 0)]


def test_a_restored_pending_producer_is_pruned_by_its_last_message_not_its_last_ack(
        ) -> None:
    """A producer in its first transaction has no ACK yet: restored from a checkpoint,
    its age is its last message's, so it is kept (and its ACK then commits what it
    published before the checkpoint); one silent past the horizon is forgotten."""
    hour = 3600
    seq = Sequencer()
    seq.queue(env("j", 0, 1, muuid.Clock.from_unix(0), Flags.CONTINUE_TXN))  # dead
    seq.queue(env("j", 10, 2, muuid.Clock.from_unix(30 * hour), Flags.CONTINUE_TXN))
    seq.queue(env("j", 20, 3, muuid.Clock.from_unix(31 * hour), Flags.OUTSIDE_TXN))
    assert [e.begin for e in seq.drain()] == [20]
    states = seq.producer_states(prune_horizon=24 * hour)
    assert sorted((s.producer, s.begin) for s in states) == [(2, 10), (3, -1)]
    restored = Sequencer(states)
    assert len(restored.producer_states(prune_horizon=24 * hour)) == 2
    restored.queue(env("j", 30, 2, muuid.Clock.from_unix(32 * hour), Flags.ACK_TXN))
    with pytest.raises(ReplayRequired) as replay:
        restored.drain()
    assert (replay.value.begin, replay.value.end) == (10, 30)
    restored.start_replay([env("j", 10, 2, muuid.Clock.from_unix(30 * hour),
                               Flags.CONTINUE_TXN)])
    assert [e.begin for e in restored.drain()] == [10]


def test_producer_states_refused_while_messages_wait() -> None:
    seq = Sequencer()
    seq.queue(env("j", 0, 1, 5, Flags.OUTSIDE_TXN))
    with pytest.raises(RuntimeError, match="wait to dequeue"):
        seq.producer_states()


def test_outside_txn_commits_itself_and_rolls_back_a_pending_span() -> None:
    seq = Sequencer()
    seq.queue(env("j", 0, 1, 100, Flags.CONTINUE_TXN))
    seq.queue(env("j", 10, 1, 101, Flags.OUTSIDE_TXN))
    seq.queue(env("j", 20, 1, 102, Flags.ACK_TXN))  # nothing left to commit
    assert [e.begin for e in seq.drain()] == [10]
    assert seq.rolled_back == 1


def test_an_older_ack_rolls_back_and_resets_to_at_least_once() -> None:
    seq = Sequencer()
    seq.queue(env("j", 0, 1, 100, Flags.CONTINUE_TXN))
    seq.queue(env("j", 10, 1, 101, Flags.ACK_TXN))
    seq.queue(env("j", 20, 1, 102, Flags.CONTINUE_TXN))  # the transaction that fails
    seq.queue(env("j", 30, 1, 90, Flags.ACK_TXN))  # recovered from an older checkpoint
    assert [e.begin for e in seq.drain()] == [0]
    # Messages above the reset clock are accepted again (at-least-once), not dropped.
    seq.queue(env("j", 40, 1, 100, Flags.CONTINUE_TXN))
    seq.queue(env("j", 50, 1, 103, Flags.ACK_TXN))
    assert [e.begin for e in seq.drain()] == [40]
    assert [(s.last_ack, s.begin) for s in seq.producer_states()] == [(103, -1)]
