"""A shard's checkpoint: how far each source journal has been read and processed, what
the Sequencer knows of each producer, and the ACKs that commit what the shard published.

It is written in the same store transaction as the application's state, so state and
offsets never disagree. On recovery, the ACK intents are appended again (harmless if
they were already: readers drop a repeated ACK) and the Sequencer is restored from the
producer states, so a transaction's messages are committed exactly when its checkpoint
is, and duplicates and rolled-back messages still never reach the application.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gazette.errors import ValidationError
from gazette.message import AckIntent, ProducerState
from gazette.pb import consumer_pb2 as cpb


@dataclass
class Checkpoint:
    """`sources`: journal -> offset read through; `producers`: the Sequencer's states;
    `ack_intents`: journal -> encoded ACK to append on recovery."""

    sources: dict[str, int] = field(default_factory=dict)
    producers: list[ProducerState] = field(default_factory=list)
    ack_intents: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, sources: dict[str, int], producers: list[ProducerState],
           intents: list[AckIntent]) -> Checkpoint:
        return cls(dict(sources), list(producers), {i.journal: i.data for i in intents})

    def to_pb(self) -> cpb.Checkpoint:
        out = cpb.Checkpoint()
        for journal, offset in self.sources.items():
            out.sources[journal].read_through = offset
        for st in self.producers:
            entry = out.sources[st.journal].producers.add()
            entry.id = st.producer.to_bytes(6, "big")
            entry.state.last_ack = st.last_ack
            entry.state.begin = st.begin
            entry.state.last_seen = st.last_seen
        for journal, data in self.ack_intents.items():
            out.ack_intents[journal] = data
        return out

    def encode(self) -> bytes:
        return self.to_pb().SerializeToString(deterministic=True)

    @classmethod
    def from_pb(cls, msg: cpb.Checkpoint) -> Checkpoint:
        sources: dict[str, int] = {}
        producers: list[ProducerState] = []
        for journal, source in msg.sources.items():
            if source.read_through < 0:
                raise ValidationError(f"checkpoint.sources[{journal}].read_through",
                                      f"must not be negative, got {source.read_through}")
            sources[journal] = source.read_through
            for entry in source.producers:
                if len(entry.id) != 6:
                    raise ValidationError(f"checkpoint.sources[{journal}].producers.id",
                                          f"expected 6 bytes, got {len(entry.id)}")
                producers.append(ProducerState(journal, int.from_bytes(entry.id, "big"),
                                               entry.state.last_ack, entry.state.begin,
                                               entry.state.last_seen))
        return cls(sources, producers, dict(msg.ack_intents))

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        try:
            msg = cpb.Checkpoint.FromString(data)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and kin
            raise ValidationError("checkpoint", f"not a Checkpoint: {err}") from None
        return cls.from_pb(msg)
