"""Recovery-log frames and state machine: encoding round trips, corruption found where
it starts, sequencing (a raced writer's frames skipped), live files and their segments,
and hints that let a player skip deleted files' operations."""

from __future__ import annotations

import pytest

from gazette.errors import GazetteError, ValidationError
from gazette.recoverylog.fsm import FSM, Hints, InconsistentOp, OutOfSequence, Segment
from gazette.recoverylog.ops import HEADER_SIZE, CorruptLog, Decoder, Kind, Op, chain, encode
from gazette.recoverylog.recorder import Recorder

AUTHOR = 0xA1


class Log:
    """Frames recorded in sequence by one author (as a recorder would), and the FSM
    that follows them."""

    def __init__(self, author: int = AUTHOR) -> None:
        self.author, self.fsm, self.raw = author, FSM(), bytearray()

    def op(self, kind: Kind, **fields: object) -> Op:
        data = fields.pop("data", b"")
        frame, crc = encode(kind, self.fsm.next_seq_no, self.fsm.next_checksum, self.author,
                            data=data, **fields)  # type: ignore[arg-type]
        begin = len(self.raw)
        self.raw += frame
        op = Decoder("log", begin).feed(frame)[0][0]
        assert op.crc == crc and op.end == len(self.raw)
        self.fsm.apply(op)
        return op


def decode_all(raw: bytes, chunk: int) -> list[tuple[Op, bytes]]:
    decoder, out = Decoder("log", 0), []
    for i in range(0, len(raw), chunk):
        out += decoder.feed(raw[i:i + chunk])
    assert decoder.pending == 0
    return out


def test_frames_round_trip_in_any_pieces() -> None:
    log = Log()
    log.op(Kind.CREATE, path="db/data.json")
    log.op(Kind.WRITE, fnode=1, offset=0, length=5, data=b"hello")
    log.op(Kind.TRUNCATE, fnode=1, length=3)
    log.op(Kind.LINK, fnode=1, path="db/other")
    log.op(Kind.UNLINK, fnode=1, path="db/data.json")
    log.op(Kind.NOOP)
    whole = decode_all(bytes(log.raw), len(log.raw))
    for size in (1, 7, HEADER_SIZE, 100):
        assert decode_all(bytes(log.raw), size) == whole
    assert [(o.kind, o.seq_no, o.path, d) for o, d in whole] == [
        (Kind.CREATE, 1, "db/data.json", b""), (Kind.WRITE, 2, "", b"hello"),
        (Kind.TRUNCATE, 3, "", b""), (Kind.LINK, 4, "db/other", b""),
        (Kind.UNLINK, 5, "db/data.json", b""), (Kind.NOOP, 6, "", b"")]
    assert whole[0][0].checksum == 0 and whole[1][0].checksum == chain(0, whole[0][0].crc)


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda raw: raw.__setitem__(HEADER_SIZE + 3, raw[HEADER_SIZE + 3] ^ 1),
     "checksum mismatch"),
    (lambda raw: raw.__setitem__(0, ord("X")), "no frame starts here"),
    (lambda raw: raw.__setitem__(3, 99), "unknown operation 99"),
])
def test_a_damaged_frame_is_named_by_its_offset(damage: object, reason: str) -> None:
    log = Log()
    log.op(Kind.CREATE, path="a")
    first = len(log.raw)
    log.op(Kind.WRITE, fnode=1, offset=0, length=4, data=b"data")
    raw = bytearray(log.raw)
    tail = raw[first:]
    damage(tail)  # type: ignore[operator]
    raw[first:] = tail
    decoder = Decoder("shard/log", 1000)
    with pytest.raises(CorruptLog) as err:
        decoder.feed(bytes(raw))
    assert err.value.offset == 1000 + first and reason in str(err.value)
    assert "recovery log shard/log: corrupt at offset" in str(err.value)
    assert decoder.offset == 1000 + first  # the good frame before it was taken


def test_an_impossible_length_fails_before_it_is_allocated() -> None:
    frame, _ = encode(Kind.WRITE, 1, 0, AUTHOR, fnode=1, length=3, data=b"abc")
    raw = bytearray(frame)
    raw[40:48] = (1 << 40).to_bytes(8, "little")  # the length field
    with pytest.raises(CorruptLog, match="impossible sizes"):
        Decoder("log", 0).feed(bytes(raw))


def test_encode_refuses_what_it_could_not_decode() -> None:
    with pytest.raises(ValueError, match="only a write or copy carries data"):
        encode(Kind.CREATE, 1, 0, AUTHOR, path="a", data=b"x")
    with pytest.raises(ValueError, match="says length"):
        encode(Kind.WRITE, 1, 0, AUTHOR, fnode=1, length=2, data=b"x")


def test_a_raced_writers_frames_are_out_of_sequence() -> None:
    log = Log()
    log.op(Kind.CREATE, path="a")
    stale, _ = encode(Kind.WRITE, 2, 12345, 0xB2, fnode=1, length=1, data=b"z")
    op = Decoder("log", 0).feed(stale)[0][0]
    with pytest.raises(OutOfSequence, match="expected 2"):
        log.fsm.apply(op)
    log.op(Kind.WRITE, fnode=1, offset=0, length=1, data=b"y")  # the lineage goes on
    assert log.fsm.next_seq_no == 3


def test_operations_that_contradict_the_files_are_inconsistent() -> None:
    log = Log()
    log.op(Kind.CREATE, path="a")
    with pytest.raises(InconsistentOp, match="path is in use"):
        log.op(Kind.CREATE, path="a")
    log = Log()
    with pytest.raises(InconsistentOp, match="no such live file"):
        log.op(Kind.WRITE, fnode=9, length=1, data=b"x")


def test_live_files_and_their_segments_make_hints() -> None:
    log = Log()
    log.op(Kind.CREATE, path="db")                                # fnode 1
    log.op(Kind.WRITE, fnode=1, length=2, data=b"v1")
    tmp = log.op(Kind.CREATE, path="db.tmp")                      # fnode 3, deleted
    log.op(Kind.WRITE, fnode=tmp.seq_no, length=2, data=b"v2")
    log.op(Kind.UNLINK, fnode=tmp.seq_no, path="db.tmp")
    log.author = 0xB2                                             # a new primary
    log.op(Kind.NOOP)
    last = log.op(Kind.WRITE, fnode=1, offset=2, length=1, data=b"!")
    hints = log.fsm.hints("shard/log")
    assert set(hints.live_nodes) == {1}
    first, second = hints.live_nodes[1]
    assert (first.author, first.first_seq_no, first.last_seq_no) == (AUTHOR, 1, 2)
    assert (second.author, second.first_seq_no, second.last_seq_no) == (0xB2, 7, 7)
    assert second.last_offset == last.end
    assert Hints.decode(hints.encode()) == hints


def test_playback_from_hints_skips_deleted_files() -> None:
    log = Log()
    log.op(Kind.CREATE, path="keep")                              # 1
    dead = log.op(Kind.CREATE, path="gone")                       # 2
    log.op(Kind.WRITE, fnode=1, length=1, data=b"k")              # 3
    log.op(Kind.WRITE, fnode=dead.seq_no, length=1, data=b"g")    # 4
    log.op(Kind.UNLINK, fnode=dead.seq_no, path="gone")           # 5
    log.op(Kind.WRITE, fnode=1, offset=1, length=1, data=b"2")    # 6
    hints = log.fsm.hints("log")
    after = log.op(Kind.CREATE, path="new")                       # 7: after the hints
    player = FSM(hints)
    played = [(op.seq_no, player.apply(op)) for op, _ in decode_all(bytes(log.raw), 64)]
    assert played == [(1, True), (2, False), (3, True), (4, False), (5, False),
                      (6, True), (7, True)]
    assert player.links == {"keep": 1, "new": after.seq_no}


def test_hints_play_a_compaction_that_deletes_an_old_file_after_the_new_ones_last_write(
        ) -> None:
    """Write a new file, then delete the old one: the hints name only the new file, yet
    the old one's unlink comes after the new one's last operation. A player from them
    skips the old file whole (it never made it), not only up to the new one's end."""
    log = Log()
    old = log.op(Kind.CREATE, path="sst-1")                        # 1
    log.op(Kind.WRITE, fnode=old.seq_no, length=3, data=b"old")    # 2
    new = log.op(Kind.CREATE, path="sst-2")                        # 3
    log.op(Kind.WRITE, fnode=new.seq_no, length=3, data=b"new")    # 4
    log.op(Kind.LINK, fnode=old.seq_no, path="sst-1.bak")          # 5: still the old one's
    log.op(Kind.UNLINK, fnode=old.seq_no, path="sst-1")            # 6
    log.op(Kind.UNLINK, fnode=old.seq_no, path="sst-1.bak")        # 7: it is dead
    hints = log.fsm.hints("log")
    assert set(hints.live_nodes) == {new.seq_no}
    log.op(Kind.CREATE, path="sst-1")                              # 8: the name reused
    player = FSM(hints)
    played = [(op.seq_no, player.apply(op)) for op, _ in decode_all(bytes(log.raw), 64)
              if op.seq_no >= hints.segments()[0].first_seq_no]
    assert played == [(3, True), (4, True), (5, False), (6, False), (7, False),
                      (8, True)]
    assert player.links == {"sst-2": new.seq_no, "sst-1": 8}


def test_malformed_hints_are_refused_with_the_field() -> None:
    with pytest.raises(ValidationError, match="not JSON"):
        Hints.decode(b"{nope")
    with pytest.raises(ValidationError, match=r"hints\.log"):
        Hints.decode(b'{"log": ""}')
    bad = Hints("log", {1: [Segment(1, 5, 100, 0, 4, 90)]}).encode()
    with pytest.raises(ValidationError, match="segments out of order"):
        Hints.decode(bad)


def test_a_write_that_continues_the_last_one_extends_it() -> None:
    # SQLite writes a WAL frame's header, then its page, at the next offset: one
    # operation in the log. A gap, another file or another kind of operation starts anew.
    recorder = Recorder(None, "log", FSM(), AUTHOR, 0)  # type: ignore[arg-type]
    a, b = recorder.create("a"), recorder.create("b")
    recorder.write(a, 0, b"head")
    recorder.write(a, 4, bytearray(b"page"))
    recorder.write(a, 8, memoryview(b"more"))
    recorder.write(a, 20, b"gap")
    recorder.write(b, 23, b"other file")
    recorder.truncate(b, 5)
    recorder.write(b, 5, b"after")
    assert recorder.pending_bytes > 0
    with pytest.raises(GazetteError, match="not committed"):
        recorder.hints()
    recorder._close_write()
    writes = [(op.fnode, op.offset, data) for op, data in
              decode_all(bytes(recorder._pending), 7) if op.kind == Kind.WRITE]
    assert writes == [(a, 0, b"headpagemore"), (a, 20, b"gap"), (b, 23, b"other file"),
                      (b, 5, b"after")]


def test_a_copy_names_its_blocks_and_needs_a_live_source() -> None:
    from gazette.recoverylog.ops import copies, copy_data

    data = copy_data(4096, [(32, 0), (4152, 8192)])
    assert copies(data) == (4096, [(32, 0), (4152, 8192)])
    with pytest.raises(ValueError, match="not a block size and pairs"):
        copies(data[:-1])
    log = Log()
    log.op(Kind.CREATE, path="db")   # fnode 1
    log.op(Kind.CREATE, path="wal")  # fnode 2
    copy = log.op(Kind.COPY, fnode=1, offset=2, length=len(data), data=data)
    assert Decoder("log", 0).feed(bytes(log.raw))[2] == (copy, data)
    with pytest.raises(InconsistentOp, match="no live file 9 to read from"):
        log.op(Kind.COPY, fnode=1, offset=9, length=len(data), data=data)


def test_a_dead_file_a_live_one_copied_from_stays_in_the_hints() -> None:
    from gazette.recoverylog.ops import copy_data

    data = copy_data(2, [(0, 0)])
    log = Log()
    log.op(Kind.CREATE, path="db")   # 1
    log.op(Kind.CREATE, path="wal")  # 2
    log.op(Kind.WRITE, fnode=2, offset=0, length=2, data=b"ab")
    log.op(Kind.COPY, fnode=1, offset=2, length=len(data), data=data)
    log.op(Kind.UNLINK, fnode=2, path="wal")  # the source dies: kept, with its unlink
    hints = log.fsm.hints("log")
    assert set(hints.live_nodes) == {1, 2}
    assert hints.live_nodes[2][-1].last_seq_no == 5
    log.op(Kind.UNLINK, fnode=1, path="db")  # and let go once nothing needs it
    assert log.fsm.hints("log").live_nodes == {} and not log.fsm.retained


def test_a_patch_round_trips_and_reads_live_files_only() -> None:
    from gazette.recoverylog.ops import patch_data, patch_sources, patched, xor

    blocks = [(0, 0, 3), (2, 10, 4)]
    data = patch_data(blocks, b"abcWXYZ")
    assert patched(data)[0] == blocks and bytes(patched(data)[1]) == b"abcWXYZ"
    assert xor(b"\x01\x02", b"\x03\x02") == b"\x02\x00"
    with pytest.raises(ValueError, match="blocks of 7 bytes"):
        patch_data(blocks, b"abc")
    with pytest.raises(ValueError, match="does not decompress"):
        patched(b"not zstd")
    log = Log()
    log.op(Kind.CREATE, path="wal")  # 1
    log.op(Kind.CREATE, path="db")   # 2
    log.op(Kind.PATCH, fnode=1, offset=0, length=len(data), data=data,
           path=patch_sources(blocks))
    assert log.fsm.live[1].sources == {2}
    with pytest.raises(InconsistentOp, match="no live file 7 to read from"):
        log.op(Kind.PATCH, fnode=1, offset=0, length=len(data), data=data, path="7")
