"""Message types (`gazette.message.types`): UUID fields, acknowledgements, adapters."""

from __future__ import annotations

import dataclasses
import uuid as std_uuid
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import given
from hypothesis import strategies as st

from gazette.errors import ValidationError
from gazette.message import types
from gazette.message import uuid as uuids
from gazette.message.adapters import message_type, to_builtins
from gazette.message.base import Message
from gazette.message.types import (
    NO_ACKNOWLEDGEMENT,
    AtLeastOnce,
    CsvRecord,
    DataclassMessage,
    JsonMessage,
    ProtoMessage,
    check_uuid_texts,
    uuid_from_text,
)
from gazette.pb import broker_pb2

PRODUCER = uuids.new_producer_id()
CLOCK = uuids.Clock()
CLOCK.update()


def new_uuid(flags: int = uuids.Flags.OUTSIDE_TXN) -> int:
    return uuids.build(PRODUCER, CLOCK.tick(), flags)


V4 = str(std_uuid.UUID("6ba7b810-9dad-41d1-80b4-00c04fd430c8"))  # version 4
#: (Fixed: test ids are made of it, and every worker of a parallel run must collect
#: the same tests.)
V1 = "87efe7cb-f278-11f1-8400-5b5da90ff82b"


# -- test message classes (shared with test_framing) -----------------------------------

@dataclass(slots=True)
class Click(DataclassMessage):
    user: str = ""
    count: int = 0


@dataclass
class Order(DataclassMessage):
    """Has a required field, so it overrides `acknowledgement`."""

    item: str
    qty: int = 1

    @classmethod
    def acknowledgement(cls, journal: str) -> Order:
        return cls(item="")


@dataclass
class Required(DataclassMessage):
    item: str


@dataclass
class Point:
    x: int
    y: int


PydanticMessage = types.PydanticMessage


class Event(PydanticMessage):
    name: str
    n: int = 0


def _proto_classes() -> dict[str, Any]:
    """Protobuf classes built at run time: a string uuid, a bytes uuid, a bad uuid."""
    file = descriptor_pb2.FileDescriptorProto(
        name="gazette_message_test.proto", package="gazette.test", syntax="proto3")
    for name, uuid_type in [("TextEvent", FieldDescriptor.TYPE_STRING),
                            ("BytesEvent", FieldDescriptor.TYPE_BYTES),
                            ("IntEvent", FieldDescriptor.TYPE_INT64)]:
        msg = file.message_type.add(name=name)
        msg.field.add(name="uuid", number=1, type=uuid_type,
                      label=FieldDescriptor.LABEL_OPTIONAL)
        msg.field.add(name="name", number=2, type=FieldDescriptor.TYPE_STRING,
                      label=FieldDescriptor.LABEL_OPTIONAL)
        msg.field.add(name="n", number=3, type=FieldDescriptor.TYPE_INT64,
                      label=FieldDescriptor.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"gazette.test.{name}"))
        for name in ("TextEvent", "BytesEvent", "IntEvent")}


PROTOS = _proto_classes()
TextEvent, BytesEvent, IntEvent = PROTOS["TextEvent"], PROTOS["BytesEvent"], PROTOS["IntEvent"]


# -- UUID text -------------------------------------------------------------------------

def test_uuid_from_text_accepts_v1_forms() -> None:
    u = new_uuid(uuids.Flags.ACK_TXN)
    text = uuids.to_str(u)
    assert uuid_from_text(text) == u
    assert uuid_from_text(text.upper()) == u
    assert uuid_from_text("{" + text + "}") == u
    assert uuid_from_text("urn:uuid:" + text) == u
    assert uuid_from_text(text.replace("-", "")) == u
    assert uuid_from_text(None) is None
    assert uuid_from_text("") is None


@pytest.mark.parametrize("bad", [
    V4, "not a uuid", V1[:-1], V1 + "0", V1.replace("-", "_"), 12345, 1.5, ["x"],
    V1[:14] + "4" + V1[15:],            # version 4
    V1[:19] + "c" + V1[20:],            # Microsoft variant
    V1[:9] + "_" + V1[10:],             # int() would accept the underscore
    V1[:9] + "\u0663" + V1[10:],        # int() would accept a non-ASCII digit
])
def test_uuid_from_text_rejects(bad: object) -> None:
    with pytest.raises(ValidationError) as err:
        uuid_from_text(bad, "uuid")
    assert err.value.field == "uuid"


def test_check_uuid_texts_batches() -> None:
    good = [uuids.to_str(new_uuid()) for _ in range(50)]
    check_uuid_texts(good)
    check_uuid_texts([*good, None, ""])
    check_uuid_texts([])
    for bad in [V4, "x" * 36, 5, V1[:14] + "2" + V1[15:], V1[:19] + "7" + V1[20:]]:
        with pytest.raises(ValidationError):
            check_uuid_texts([*good, bad])
    # Lengths 35 and 37 adding up to two UUIDs' worth must not pass as a batch.
    a, b = good[0], good[1]
    with pytest.raises(ValidationError):
        check_uuid_texts([a[:-1], a[-1] + b])


uuid_like = st.one_of(
    st.none(), st.just(""),
    st.builds(lambda: uuids.to_str(new_uuid())),
    st.builds(lambda u: str(std_uuid.UUID(int=u)), st.integers(0, (1 << 128) - 1)),
    st.text(alphabet="0123456789abcdefABCDEF-_{} ", min_size=30, max_size=40),
)


@given(st.lists(uuid_like, max_size=8))
def test_check_uuid_texts_agrees_with_one_by_one(values: list[str | None]) -> None:
    expect_ok = True
    for v in values:
        try:
            uuid_from_text(v)
        except ValidationError:
            expect_ok = False
    if expect_ok:
        check_uuid_texts(values)
    else:
        with pytest.raises(ValidationError):
            check_uuid_texts(values)


# -- message classes -------------------------------------------------------------------

def test_json_message() -> None:
    msg = JsonMessage(a=1)
    assert isinstance(msg, Message)
    assert msg.get_uuid() is None
    u = new_uuid()
    msg.set_uuid(u)
    assert msg["uuid"] == uuids.to_str(u) and msg.get_uuid() == u
    ack = msg.new_acknowledgement("a/journal")
    assert ack == {} and type(ack) is JsonMessage

    class Sub(JsonMessage):
        __slots__ = ()

    assert type(Sub().new_acknowledgement("j")) is Sub
    with pytest.raises(ValidationError):
        JsonMessage(uuid=V4).get_uuid()


def test_dataclass_message() -> None:
    assert [f.name for f in dataclasses.fields(Click)] == ["uuid", "user", "count"]
    click = Click("bob", 3)
    assert isinstance(click, Message)
    assert not hasattr(click, "__dict__")  # slots all the way
    assert click.get_uuid() is None
    u = new_uuid()
    click.set_uuid(u)
    assert click.uuid == uuids.to_str(u) and click.get_uuid() == u
    assert click.new_acknowledgement("j") == Click()
    assert Order("pen").new_acknowledgement("j") == Order(item="")
    with pytest.raises(TypeError, match=r"override the classmethod Required.acknowledgement"):
        Required("x").new_acknowledgement("j")


def test_pydantic_message() -> None:
    assert list(Event.model_fields) == ["uuid", "name", "n"]
    assert PydanticMessage.__module__ == "gazette.message.types"
    assert types.PydanticMessage is PydanticMessage  # defined once, on first use
    event = Event(name="x")
    assert isinstance(event, Message)
    u = new_uuid()
    event.set_uuid(u)
    assert event.get_uuid() == u and event.uuid == uuids.to_str(u)
    ack = event.new_acknowledgement("j")
    assert type(ack) is Event and ack.uuid is None and "name" not in ack.__dict__
    with pytest.raises(AttributeError):
        types.NoSuchThing  # noqa: B018


def test_csv_record() -> None:
    rec = CsvRecord(["", "a"])
    assert rec.get_uuid() is None and CsvRecord().get_uuid() is None
    u = new_uuid()
    rec.set_uuid(u)
    assert rec == [uuids.to_str(u), "a"] and rec.get_uuid() == u
    empty = CsvRecord()
    empty.set_uuid(u)
    assert empty == [uuids.to_str(u)]
    assert rec.new_acknowledgement("j") == [""]
    with pytest.raises(ValidationError) as err:
        CsvRecord([V4]).get_uuid()
    assert err.value.field == "[0]"


def test_at_least_once() -> None:
    point = AtLeastOnce(Point(1, 2))
    assert isinstance(point, Message)
    point.set_uuid(new_uuid())
    assert point.get_uuid() is None
    assert point.new_acknowledgement("j") is NO_ACKNOWLEDGEMENT
    assert point == AtLeastOnce(Point(1, 2)) and point != Point(1, 2)
    assert repr(point) == "AtLeastOnce(Point(x=1, y=2))"
    assert NO_ACKNOWLEDGEMENT.get_uuid() is None
    assert NO_ACKNOWLEDGEMENT.new_acknowledgement("j") is NO_ACKNOWLEDGEMENT


def test_proto_message_uuid_fields() -> None:
    u = new_uuid()
    text = ProtoMessage(TextEvent(name="a"))
    assert isinstance(text, Message) and text.get_uuid() is None
    text.set_uuid(u)
    assert text.proto.uuid == uuids.to_str(u) and text.get_uuid() == u
    ack = text.new_acknowledgement("j")
    assert isinstance(ack, ProtoMessage) and ack.proto == TextEvent()

    raw = ProtoMessage(BytesEvent(name="a"))
    raw.set_uuid(u)
    assert raw.proto.uuid == u.to_bytes(16, "big") and raw.get_uuid() == u
    with pytest.raises(ValidationError, match="16 bytes"):
        ProtoMessage(BytesEvent(uuid=b"short")).get_uuid()
    with pytest.raises(ValidationError, match="version 1"):
        ProtoMessage(BytesEvent(uuid=std_uuid.UUID(V4).bytes)).get_uuid()

    label = ProtoMessage(broker_pb2.Label(name="a"))  # no uuid field: at-least-once
    label.set_uuid(u)
    assert label.get_uuid() is None
    assert label.new_acknowledgement("j") is NO_ACKNOWLEDGEMENT
    with pytest.raises(ValidationError, match=r"IntEvent\.uuid"):
        ProtoMessage(IntEvent()).get_uuid()


# -- adapters --------------------------------------------------------------------------

def test_message_type_rejects_what_cannot_be_a_message() -> None:
    with pytest.raises(ValidationError, match=r"AtLeastOnce\[Point\]") as err:
        message_type(Point)
    assert err.value.field == "message_type"
    with pytest.raises(ValidationError, match="cannot hold a UUID"):
        message_type(dict)
    with pytest.raises(ValidationError, match=r"IntEvent\.uuid"):
        message_type(IntEvent)

    class Odd:
        def get_uuid(self) -> None: ...
        def set_uuid(self, uuid: int) -> None: ...
        def new_acknowledgement(self, journal: str) -> Odd: return self

    with pytest.raises(ValidationError, match="don't know how"):
        message_type(Odd)
    mt = message_type(JsonMessage)
    assert message_type(mt) is mt and message_type(JsonMessage) is mt


@pytest.mark.parametrize(("cls", "value", "expect"), [
    (JsonMessage, {"uuid": V1, "a": [1]}, JsonMessage(uuid=V1, a=[1])),
    (Click, {"uuid": V1, "user": "b"}, Click("b", uuid=V1)),
    (Click, [V1, "b", "7"], Click("b", 7, uuid=V1)),          # a CSV record
    (Event, {"name": "e", "n": 2}, Event(name="e", n=2)),
    (Event, ["", "e", "2"], Event(name="e", n=2)),
    (CsvRecord, [V1, "x"], CsvRecord([V1, "x"])),
    (TextEvent, {"uuid": V1, "n": "5"}, ProtoMessage(TextEvent(uuid=V1, n=5))),
    (AtLeastOnce[Point], {"x": 1, "y": 2}, AtLeastOnce(Point(1, 2))),
    (AtLeastOnce[list[int]], [1, 2], AtLeastOnce([1, 2])),
    (AtLeastOnce, "anything", AtLeastOnce("anything")),
    (AtLeastOnce[broker_pb2.Label], {"name": "n"}, AtLeastOnce(broker_pb2.Label(name="n"))),
])
def test_from_builtins_and_back(cls: Any, value: Any, expect: Any) -> None:
    mt = message_type(cls)
    msg = mt.from_builtins(value)
    assert msg == expect and type(msg) is type(expect)
    back = mt.to_builtins(msg)
    assert mt.from_builtins(back) == expect
    assert to_builtins(msg) == back or isinstance(value, list)


@pytest.mark.parametrize(("cls", "value", "reason"), [
    (JsonMessage, [1], "expected a JSON object, got an array"),
    (JsonMessage, {"uuid": V4}, "version 1"),
    (JsonMessage, {"uuid": 7}, "expected a UUID string"),
    (Click, {"user": 5}, "Expected `str`, got `int`"),
    (Click, {"uuid": V4}, "version 1"),
    (Click, ["", "a", "b", "extra"], "4 columns, but Click has 3 fields"),
    (Click, "text", "expected a JSON object, got a string"),
    (Event, {"n": 1}, "Field required"),
    (Event, {"name": "x", "uuid": V4}, "version 1"),
    (CsvRecord, [V4], "version 1"),
    (CsvRecord, {"a": 1}, "expected a list of strings"),
    (TextEvent, {"nope": 1}, "no field named"),
    (TextEvent, {"uuid": V4}, "version 1"),
    (AtLeastOnce[list[int]], ["a"], "Expected `int`"),
])
def test_from_builtins_rejects(cls: Any, value: Any, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        message_type(cls).from_builtins(value)


def test_pydantic_acknowledgement_reads_back() -> None:
    ack = Event(name="x").new_acknowledgement("j")
    u = new_uuid(uuids.Flags.ACK_TXN)
    ack.set_uuid(u)
    mt = message_type(Event)
    back = mt.from_builtins(mt.to_builtins(ack))
    assert type(back) is Event and back.get_uuid() == u
    # Only an ACK gets this leniency.
    not_ack = {"uuid": uuids.to_str(new_uuid(uuids.Flags.CONTINUE_TXN))}
    with pytest.raises(ValidationError, match="Field required"):
        mt.from_builtins(not_ack)


def test_from_decoded_many_checks_every_uuid() -> None:
    mt = message_type(JsonMessage)
    good = [{"uuid": uuids.to_str(new_uuid())} for _ in range(10)]
    assert mt.from_decoded_many(good) == good
    with pytest.raises(ValidationError):
        mt.from_decoded_many([*good, {"uuid": V4}])
    dc = message_type(Click)
    decoded = msgspec.json.Decoder(dc.json_type).decode_lines(b'{"uuid":"%s"}\n{}\n' % V1.encode())
    assert dc.from_decoded_many(decoded) == [Click(uuid=V1), Click()]
    with pytest.raises(ValidationError):
        dc.from_decoded_many([Click(uuid=V4)])
    assert message_type(AtLeastOnce[Point]).from_decoded_many([Point(1, 2)]) == [
        AtLeastOnce(Point(1, 2))]


def test_from_protobuf() -> None:
    mt = message_type(TextEvent)
    assert mt.proto_class is TextEvent
    payload = TextEvent(uuid=V1, name="a").SerializeToString()
    assert mt.from_protobuf(payload) == ProtoMessage(TextEvent(uuid=V1, name="a"))
    with pytest.raises(ValidationError, match=r"not a valid gazette\.test\.TextEvent"):
        mt.from_protobuf(b"\xff\xff\xff")
    with pytest.raises(ValidationError, match="version 1"):
        mt.from_protobuf(TextEvent(uuid=V4).SerializeToString())
    with pytest.raises(ValidationError, match="is not a protobuf message"):
        message_type(JsonMessage).from_protobuf(payload)
    label = message_type(AtLeastOnce[broker_pb2.Label])
    assert label.proto_class is broker_pb2.Label
    assert label.from_protobuf(b"\n\x01a") == AtLeastOnce(broker_pb2.Label(name="a"))
