"""Topics and events: a topic binds a name to a message model and to the journals that
hold it; an `Event` is one message of a topic as handlers get it.

On a journal, an event is one JSON line (``application/x-ndjson``), so any Gazette
reader (gazctl, Spark, the HTTP gateway) can read it::

    {"uuid": "<v1 UUID: producer, clock, flags>", "id": "<event id>", "key": "<key>",
     "time": <unix seconds when produced>, "data": {...the model as JSON...}}

The UUID makes reading exactly-once (the Sequencer drops a repeated append); the event
id identifies the event across re-sends (the outbox may send an event again after a
crash, with a new UUID): exactly-once handlers skip ids they processed.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gazette.errors import GazetteError, ValidationError
from gazette.labels import LabelSet, Selector, parse_selector
from gazette.message import JsonMessage
from gazette.message.adapters import MessageType, value_type
from gazette.names import validate_token
from gazette.protocol import FragmentSpec, JournalSpec

M = TypeVar("M")

NDJSON = "application/x-ndjson"
#: Label of a topic's partition journals: the topic's name.
TOPIC_LABEL = "events.gazette.dev/topic"
#: Labels of a group's retry and dead-letter journals.
GROUP_LABEL, ROLE_LABEL = "events.gazette.dev/group", "events.gazette.dev/role"
RETRY, DEAD = "retry", "dead"
#: Where topics' journals live unless told otherwise.
DEFAULT_PREFIX = "events/"
DEFAULT_PARTITIONS = 4


class TopicNotRegistered(GazetteError):
    """A topic was used that this `Events` was not told of (with required registration),
    or whose journals do not exist and may not be created here."""


class EventTypeError(GazetteError):
    """An event's data does not fit its topic's model: names the topic, the event and the
    field (routed by the handler's failure policy, never dropped silently)."""


def validate_name(value: object, what: str) -> str:
    """A topic, group or handler name: letters, digits and ``-_.``, beginning with a
    letter or digit (it becomes part of journal names and metric labels)."""
    name = validate_token(value, what, "-_.", 1, 100)
    if not name[0].isalnum():
        raise ValidationError(what, f"{name!r} must begin with a letter or digit")
    return name


@dataclass(frozen=True)
class Topic(Generic[M]):
    """Events of `model` (a pydantic model, a msgspec Struct or a dataclass) named `name`.

    `key` gives an event's key (default: its id, which spreads events evenly): events
    of one key go to one partition journal, so they are read in the order produced.
    `partitions` is how many journals ``events/<name>/part-NNN`` it gets when it is
    created (on first use, or by ``gazctl events create-topic``).
    """

    name: str
    model: type[M]
    key: Callable[[M], str] | None = None
    partitions: int = DEFAULT_PARTITIONS
    _type: MessageType[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_name(self.name, "topic")
        if not 1 <= self.partitions <= 1024:
            raise ValidationError("partitions", f"must be in [1, 1024], got {self.partitions}")
        object.__setattr__(self, "_type", value_type(self.model))

    @property
    def selector(self) -> Selector:
        return parse_selector(f"{TOPIC_LABEL}={self.name}")

    def to_data(self, payload: M) -> Any:
        """`payload` as JSON-able builtins (raises ValidationError for a wrong type)."""
        if not isinstance(payload, self.model):
            raise ValidationError(f"topic {self.name}", f"expects a {self.model.__name__}, "
                                  f"got a {type(payload).__name__}")
        return self._type.to_builtins(payload)

    def from_data(self, data: Any, event_id: str) -> M:
        try:
            return self._type.from_builtins(data)  # type: ignore[no-any-return]
        except (ValidationError, TypeError, ValueError) as err:
            raise EventTypeError(f"topic {self.name}: event {event_id} does not fit "
                                 f"{self.model.__name__}: {err}") from None

    def new_line(self, payload: M, *, event_id: str = "", key: str | None = None
                 ) -> JsonMessage:
        """The journal message of `payload` (its UUID is set when it is published)."""
        data = self.to_data(payload)  # first: it checks the type
        event_id = event_id or uuidlib.uuid4().hex
        if key is None:
            key = self.key(payload) if self.key is not None else event_id
        return JsonMessage(id=event_id, key=key, time=time.time(), data=data)


def partition_specs(topic: str, partitions: int, *, prefix: str = DEFAULT_PREFIX,
                    replication: int = 1, fragment_store: str = "file:///"
                    ) -> list[JournalSpec]:
    """The JournalSpecs of a new topic's partitions."""
    labels = LabelSet([(TOPIC_LABEL, topic), ("content-type", NDJSON)])
    return [journal_spec(f"{prefix}{topic}/part-{i:03d}", labels, replication, fragment_store)
            for i in range(partitions)]


def group_journal(topic: str, group: str, role: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The retry (`RETRY`) or dead-letter (`DEAD`) journal of `topic` in `group`."""
    return f"{prefix}{topic}/{role}/{group}"


def group_journal_spec(topic: str, group: str, role: str, *, prefix: str = DEFAULT_PREFIX,
                       replication: int = 1, fragment_store: str = "file:///") -> JournalSpec:
    labels = LabelSet([(GROUP_LABEL, group), (ROLE_LABEL, role), ("content-type", NDJSON)])
    return journal_spec(group_journal(topic, group, role, prefix), labels, replication,
                        fragment_store)


def journal_spec(name: str, labels: LabelSet, replication: int, fragment_store: str,
                 ) -> JournalSpec:
    return JournalSpec(name, replication=replication, labels=labels,
                       fragment=FragmentSpec(stores=(fragment_store,)))


def failed_line(event: dict[str, Any], *, topic: str, group: str, handler: str,
                attempt: int, source: str, error: str = "",
                retry_at: float | None = None) -> JsonMessage:
    """The line a retry or dead-letter journal holds for `event` (a raw event line):
    the event itself, which handler of which group failed it, how often, why, and where
    it was read; `retry_at` (unix seconds) for a retry journal."""
    line = JsonMessage({k: event[k] for k in ("id", "key", "time", "data") if k in event})
    line.update(topic=topic, group=group, handler=handler, attempt=attempt, source=source)
    if error:
        line["error"] = error[:4000]
    if retry_at is not None:
        line["retry_at"] = retry_at
    return line


@dataclass(frozen=True, slots=True)
class Event(Generic[M]):
    """One event as a handler gets it: `payload` is the topic's model."""

    topic: str
    id: str
    key: str
    #: Unix seconds when it was produced.
    time: float
    payload: M
    #: Where it was read: journal and byte offset.
    journal: str = ""
    offset: int = 0
    #: 0 the first time; n on the n-th retry (a retry journal's event).
    attempt: int = 0
