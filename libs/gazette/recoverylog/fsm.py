"""The recovery log's state machine: which operations are in sequence, which files
(fnodes) are live and where in the log their operations are, and the hints built
from that (pure: no I/O).

Every operation carries the sequence number and lineage checksum it expects; one
that does not match is *out of sequence* (a writer that lost the log raced its
successor) and is skipped by every reader alike, so all readers agree on one history.

Hints name each live fnode's *segments*: runs of the log written by one author, with
their first and last sequence numbers and offsets. A player reads only those runs (and
everything after the last), skipping stretches that hold only files deleted since.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from gazette.errors import GazetteError, ValidationError
from gazette.pb import recoverylog_pb2 as rpb
from gazette.recoverylog.ops import Kind, Op, chain, sources_of


class OutOfSequence(GazetteError):
    """An operation that does not extend the lineage read so far (skipped)."""


class InconsistentOp(GazetteError):
    """An in-sequence operation that contradicts the files it applies to (a bug in a
    recorder, or a log that is not a recovery log): playback cannot go on."""


@dataclass
class Segment:
    """Operations [first_seq_no, last_seq_no] of one author at log offsets
    [first_offset, last_offset); `first_checksum`: the lineage checksum before the
    first."""

    author: int
    first_seq_no: int
    first_offset: int
    first_checksum: int
    last_seq_no: int
    last_offset: int

    def copy(self) -> Segment:
        """A copy (cheaper than through `asdict`: hints are taken at every commit)."""
        return Segment(self.author, self.first_seq_no, self.first_offset,
                       self.first_checksum, self.last_seq_no, self.last_offset)


@dataclass
class Hints:
    """What a player needs to rebuild the files: the log, and each live fnode's
    segments (an empty list: play the log from its start). `through`: the sequence
    number of the log's last operation when they were taken (0: not known), which
    orders hints of one log: later ones never give way to earlier ones."""

    log: str
    live_nodes: dict[int, list[Segment]] = field(default_factory=dict)
    through: int = 0

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"log": self.log, "live_nodes": [
            {"fnode": f, "segments": [asdict(s) for s in segs]}
            for f, segs in sorted(self.live_nodes.items())]}
        if self.through:
            doc["through"] = self.through
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | str, where: str = "hints") -> Hints:
        try:
            doc = json.loads(raw)
        except ValueError as err:
            raise ValidationError(where, f"not JSON: {err}") from None
        try:
            log = doc["log"]
            if not isinstance(log, str) or not log:
                raise ValidationError(f"{where}.log", "expected a journal name")
            nodes: dict[int, list[Segment]] = {}
            for node in doc.get("live_nodes", []):
                segs = [Segment(**{k: int(v) for k, v in s.items()})
                        for s in node["segments"]]
                if not segs or any(s.first_seq_no > s.last_seq_no or s.first_offset
                                   > s.last_offset or s.first_offset < 0 for s in segs):
                    raise ValidationError(f"{where}.live_nodes[{node['fnode']}]",
                                          "segments out of order")
                nodes[int(node["fnode"])] = segs
            through = int(doc.get("through", 0))
            if through < 0:
                raise ValidationError(f"{where}.through", "must not be negative")
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, ValidationError):
                raise
            raise ValidationError(where, f"malformed hints: {err!r}") from None
        return cls(log, nodes, through)

    def to_pb(self) -> rpb.FSMHints:
        """As GetHints answers them."""
        return rpb.FSMHints(log=self.log, live_nodes=[
            rpb.FSMHints.FnodeSegments(fnode=f, segments=[
                rpb.Segment(author=s.author, first_seq_no=s.first_seq_no,
                            first_offset=s.first_offset, first_checksum=s.first_checksum,
                            last_seq_no=s.last_seq_no, last_offset=s.last_offset,
                            log=self.log) for s in segs])
            for f, segs in sorted(self.live_nodes.items())])

    @classmethod
    def from_pb(cls, msg: rpb.FSMHints) -> Hints:
        return cls(msg.log, {n.fnode: [Segment(s.author, s.first_seq_no, s.first_offset,
                                               s.first_checksum, s.last_seq_no,
                                               s.last_offset) for s in n.segments]
                             for n in msg.live_nodes})

    def first_offset(self) -> int:
        """The log offset a player given these hints reads from (0: the start): what
        must be kept of the log for them."""
        return min((s.first_offset for segs in self.live_nodes.values() for s in segs),
                   default=0)

    def segments(self) -> list[Segment]:
        """Every hinted segment, merged where they overlap, in log order: what a player
        reads before the rest of the log."""
        out: list[Segment] = []
        for seg in sorted((s for segs in self.live_nodes.values() for s in segs),
                          key=lambda s: s.first_seq_no):
            last = out[-1] if out else None
            if last is not None and seg.first_seq_no <= last.last_seq_no + 1 and \
                    seg.author == last.author:
                if seg.last_seq_no > last.last_seq_no:
                    last.last_seq_no, last.last_offset = seg.last_seq_no, seg.last_offset
            else:
                out.append(seg.copy())
        return out


@dataclass
class _Fnode:
    paths: set[str] = field(default_factory=set)
    segments: list[Segment] = field(default_factory=list)
    #: Fnodes this one copied blocks from: a player needs their content as it was.
    sources: set[int] = field(default_factory=set)


class FSM:
    """Follows operations in sequence. `apply` raises `OutOfSequence` for one to skip
    and `InconsistentOp` for one that cannot be."""

    def __init__(self, hints: Hints | None = None) -> None:
        self.next_seq_no = 1
        self.next_checksum = 0
        self.author = 0  # of the last operation applied
        self.links: dict[str, int] = {}  # path -> fnode
        self.live: dict[int, _Fnode] = {}
        #: Dead fnodes a live one copied from (kept in hints: a player plays them).
        self.retained: dict[int, _Fnode] = {}
        #: Hinted segments not yet read, in order; the fnodes they keep.
        self.pending: list[Segment] = []
        self.hinted: set[int] = set()
        #: Fnodes made through this sequence number are played only if hinted.
        self.hinted_through = 0
        if hints is not None and hints.live_nodes:
            self.pending = hints.segments()
            self.hinted = set(hints.live_nodes)
            self.hinted_through = self.pending[-1].last_seq_no
            first = self.pending[0]
            self.next_seq_no, self.next_checksum = first.first_seq_no, first.first_checksum

    def skip_to(self, segment: Segment) -> None:
        """Reading jumps over a stretch of dead operations to `segment`."""
        self.next_seq_no, self.next_checksum = segment.first_seq_no, segment.first_checksum

    def apply(self, op: Op) -> bool:
        """Apply `op` (read at its offsets); returns whether its effect on files is to
        be played (False: it only writes files that are dead by the hints)."""
        if op.seq_no != self.next_seq_no or op.checksum != self.next_checksum:
            raise OutOfSequence(f"operation {op.seq_no} (checksum {op.checksum:08x}) at "
                                f"offset {op.begin}; expected {self.next_seq_no} "
                                f"({self.next_checksum:08x})")
        while self.pending and op.seq_no > self.pending[0].last_seq_no:
            self.pending.pop(0)
        fnode = op.seq_no if op.kind is Kind.CREATE else op.fnode
        # An fnode made within the hints that they do not name was deleted before they
        # were taken (its creation may not even have been read): its operations are
        # skipped, even those after the hinted files' last one (its unlink, say).
        live = op.kind is Kind.NOOP or fnode > self.hinted_through or \
            fnode in self.hinted or fnode in self.live or fnode in self.retained
        if live:
            self._effect(op, fnode)
        self.next_seq_no += 1
        self.next_checksum = chain(op.checksum, op.crc)
        self.author = op.author
        return live and op.kind is not Kind.NOOP

    def _effect(self, op: Op, fnode: int) -> None:
        kind = op.kind
        if kind is Kind.NOOP:
            return
        if kind is Kind.CREATE:
            if op.path in self.links:
                raise InconsistentOp(f"create of {op.path!r} (offset {op.begin}): the "
                                     "path is in use")
            self.live[fnode] = _Fnode({op.path})
            self.links[op.path] = fnode
        else:
            node = self.live.get(fnode)
            if node is None:
                raise InconsistentOp(f"{kind.name.lower()} of fnode {fnode} (offset "
                                     f"{op.begin}): no such live file")
            if kind is Kind.LINK:
                if op.path in self.links:
                    raise InconsistentOp(f"link of {op.path!r} (offset {op.begin}): the "
                                         "path is in use")
                node.paths.add(op.path)
                self.links[op.path] = fnode
            elif kind is Kind.UNLINK:
                if self.links.get(op.path) != fnode:
                    raise InconsistentOp(f"unlink of {op.path!r} (offset {op.begin}): "
                                         f"not a path of fnode {fnode}")
                node.paths.discard(op.path)
                del self.links[op.path]
                if not node.paths:
                    self._extend(node, op)
                    del self.live[fnode]
                    self._retain(fnode, node)
                    return
            elif kind in (Kind.COPY, Kind.PATCH):
                try:
                    sources = {op.offset} if kind is Kind.COPY else sources_of(op.path)
                except ValueError as err:
                    raise InconsistentOp(f"{kind.name.lower()} of fnode {fnode} (offset "
                                         f"{op.begin}): {err}") from None
                missing = sources - set(self.live)
                if missing:
                    raise InconsistentOp(f"{kind.name.lower()} into fnode {fnode} (offset "
                                         f"{op.begin}): no live file {min(missing)} to "
                                         "read from")
                node.sources |= sources - {fnode}
        self._extend(self.live[fnode], op)

    def _retain(self, fnode: int, node: _Fnode) -> None:
        """`fnode` died: kept while a live fnode read from it, directly or through
        other dead ones (their content then is part of theirs); and what no live fnode
        needs any more is let go."""
        self.retained[fnode] = node
        needed: set[int] = set()
        stack = [f for n in self.live.values() for f in n.sources]
        while stack:
            f = stack.pop()
            if f in needed:
                continue
            needed.add(f)
            source = self.live.get(f) or self.retained.get(f)
            if source is not None:
                stack.extend(source.sources)
        self.retained = {f: n for f, n in self.retained.items() if f in needed}

    def _extend(self, node: _Fnode, op: Op) -> None:
        last = node.segments[-1] if node.segments else None
        if last is not None and last.author == op.author:
            last.last_seq_no, last.last_offset = op.seq_no, op.end
        else:
            node.segments.append(Segment(op.author, op.seq_no, op.begin, op.checksum,
                                         op.seq_no, op.end))

    def hints(self, log: str) -> Hints:
        """Hints that rebuild the live files as of now."""
        return Hints(log, {f: [s.copy() for s in node.segments]
                           for f, node in (*self.live.items(), *self.retained.items())},
                     self.next_seq_no - 1)

    def paths(self, fnode: int) -> set[str]:
        node = self.live.get(fnode)
        return set(node.paths) if node is not None else set()

    def describe(self) -> dict[str, Any]:
        return {"next_seq_no": self.next_seq_no, "live": len(self.live),
                "links": len(self.links)}
