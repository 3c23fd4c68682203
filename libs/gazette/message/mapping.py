"""Mapping messages to journals: the partitions of a topic and how a message picks one.

A *topic* is the set of journals a label selector picks (``prefix=foobar/``), each journal
a *partition*. A mapping is a callable ``msg -> Partition`` that the `Publisher` calls for
every message; build one from a *key function* and a `Partitions` source:

    partitions = StaticPartitions(specs, parse_selector("prefix=foobar/"))
    by_user = rendezvous_mapping(lambda m: m["user"].encode(), partitions)
    publisher.publish_committed(by_user, {"user": "alice", "clicks": 3})

- `modulo_mapping`: FNV-1a 32 of the key modulo the number of partitions (as Gazette's
  ModuloMapping, so a Go and a Python publisher agree on where a key goes). Cheapest, but
  adding or removing a partition moves most keys.
- `rendezvous_mapping`: highest random weight. Each partition scores the key and the
  highest score wins, so adding a partition moves only the keys it now wins (about 1/n)
  and removing one moves only its own keys. Costs one small hash per partition.
- `random_mapping`: any partition, uniformly (no key: no ordering between messages).

Messages sharing a key go to one journal, so they are read in publish order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from gazette.errors import GazetteError
from gazette.labels import Selector, journal_labels
from gazette.protocol import JournalSpec

#: The journal label that names a journal's framing (``application/x-ndjson``, ...).
CONTENT_TYPE_LABEL = "content-type"

KeyFunc: TypeAlias = Callable[[Any], bytes]
"""The mapping key of a message as bytes, such as ``lambda m: m["user"].encode()``.
Messages with equal keys map to the same partition (while the partitions don't change).
Exceptions it raises propagate to the publisher's caller."""


@dataclass(frozen=True, slots=True)
class Partition:
    """One journal of a topic: its name and its content type (``content-type`` label;
    empty if the journal has none, which the Publisher reports when it is used)."""

    journal: str
    content_type: str

    @classmethod
    def of(cls, spec: JournalSpec) -> Partition:
        return cls(spec.name, spec.labels.value_of(CONTENT_TYPE_LABEL) or "")


MappingFunc: TypeAlias = Callable[[Any], Partition]
"""Picks the partition of a message; raises `NoPartitions` when the topic is empty."""


class Partitions(Protocol):
    """The journals a selector picks, which may change over time.

    The contract for implementations (a static list now; one polled from the brokers'
    List RPC later):

    - `current()` returns the latest partitions, sorted by journal name, quickly (no I/O:
      it is called once per published message);
    - while they are unchanged it returns the *same* sequence object, and a *new* object
      when they change (never mutates a returned one), so mappings cache what they
      precompute per partition list by its identity;
    - `selector` is the selector the partitions come from (named in `NoPartitions`).
    """

    @property
    def selector(self) -> Selector: ...

    def current(self) -> Sequence[Partition]: ...


class StaticPartitions:
    """The journals among `specs` that `selector` matches (with their implicit ``name``
    and ``prefix`` labels), fixed at construction."""

    __slots__ = ("_partitions", "_selector")

    def __init__(self, specs: Iterable[JournalSpec], selector: Selector) -> None:
        self._selector = selector
        self._partitions: tuple[Partition, ...] = tuple(sorted(
            (Partition.of(spec) for spec in specs
             if selector.matches(journal_labels(spec.name, spec.labels))),
            key=lambda p: p.journal,
        ))

    @property
    def selector(self) -> Selector:
        return self._selector

    def current(self) -> tuple[Partition, ...]:
        return self._partitions

    def __repr__(self) -> str:
        return f"StaticPartitions({self._selector.format()!r}: {len(self._partitions)} journals)"


class NoPartitions(GazetteError):
    """No journal currently matches the topic's selector; publishing may succeed later,
    once journals are created (or the partitions are next refreshed)."""

    def __init__(self, selector: Selector) -> None:
        self.selector = selector
        text = selector.format()
        super().__init__(
            f"no journals match selector {text!r}" if text else "no journals to publish to")


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a of `data` (offset basis 2166136261, prime 16777619)."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def modulo_mapping(key: KeyFunc, partitions: Partitions) -> MappingFunc:
    """Maps a message to ``partitions[fnv1a_32(key(msg)) % len(partitions)]``."""

    def mapping(msg: Any) -> Partition:
        parts = partitions.current()
        if not parts:
            raise NoPartitions(partitions.selector)
        return parts[fnv1a_32(key(msg)) % len(parts)]

    return mapping


def rendezvous_mapping(key: KeyFunc, partitions: Partitions) -> MappingFunc:
    """Maps a message to the partition of highest weight for its key, the weight being
    the 64-bit BLAKE2b of ``journal name, NUL, key`` (stable across processes and
    versions). The hash state of each journal's prefix is computed once per partition
    list, so each message costs one key copy-update-digest per partition."""
    cached: Sequence[Partition] | None = None
    states: list[tuple[hashlib.blake2b, Partition]] = []

    def mapping(msg: Any) -> Partition:
        nonlocal cached, states
        parts = partitions.current()
        if parts is not cached:
            states = [
                (hashlib.blake2b(p.journal.encode() + b"\0", digest_size=8), p)
                for p in parts
            ]
            cached = parts
        if not states:
            raise NoPartitions(partitions.selector)
        k = key(msg)
        best = states[0][1]
        best_score = b""
        for state, part in states:
            h = state.copy()
            h.update(k)
            score = h.digest()  # 8 bytes: compares as a big-endian integer
            if score > best_score:
                best_score, best = score, part
        return best

    return mapping


def random_mapping(partitions: Partitions, rng: random.Random | None = None) -> MappingFunc:
    """Maps each message to a uniformly random partition (`rng`: for reproducible tests)."""
    choice = (rng or random.Random()).choice

    def mapping(msg: Any) -> Partition:
        parts = partitions.current()
        if not parts:
            raise NoPartitions(partitions.selector)
        return choice(parts)

    return mapping
