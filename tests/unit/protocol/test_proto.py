"""The generated protobuf code: it's current with proto/, and its messages and services work."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from gazette.pb import (
    broker_pb2,
    broker_pb2_grpc,
    consumer_pb2,
    consumer_pb2_grpc,
    recoverylog_pb2,
)

ROOT = Path(__file__).resolve().parents[3]


def _load_gen_proto() -> ModuleType:
    path = ROOT / "scripts" / "gen_proto.py"
    spec = importlib.util.spec_from_file_location("_gen_proto_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen_proto = _load_gen_proto()


def test_generated_code_is_current() -> None:
    stale: list[str] = gen_proto.stale_files()
    assert not stale, (
        "generated protobuf code differs from proto/ (run `.venv/bin/python "
        "scripts/gen_proto.py` and commit the result); stale files:\n  " + "\n  ".join(stale)
    )


def test_check_reports_changed_missing_and_extra_files(tmp_path: Path) -> None:
    fresh, committed = tmp_path / "fresh", tmp_path / "committed"
    fresh.mkdir()
    committed.mkdir()
    for name in ("__init__.py", "a_pb2.py", "b_pb2.pyi", "c_pb2_grpc.py"):
        (fresh / name).write_text(name)
    (committed / "__init__.py").write_text("__init__.py")  # Same.
    (committed / "a_pb2.py").write_text("edited")  # Changed.
    # b_pb2.pyi is missing; c_pb2_grpc.py is the same; d_pb2.py is left over.
    (committed / "c_pb2_grpc.py").write_text("c_pb2_grpc.py")
    (committed / "d_pb2.py").write_text("d_pb2.py")
    (committed / "notes.txt").write_text("not generated")  # Ignored.

    names = gen_proto.differences_by_name(fresh, committed)
    assert names == ["a_pb2.py", "b_pb2.pyi", "d_pb2.py"]


def _round_trip(message: Message) -> None:
    data = message.SerializeToString(deterministic=True)
    again = type(message).FromString(data)
    assert again == message
    assert again.SerializeToString(deterministic=True) == data


def test_journal_spec_round_trips() -> None:
    spec = broker_pb2.JournalSpec(
        name="acme/orders/part-000",
        replication=3,
        labels=broker_pb2.LabelSet(
            labels=[
                broker_pb2.Label(name="app.gazette.dev/message-type", value="Order"),
                broker_pb2.Label(name="topic", value="orders"),
            ]
        ),
        fragment=broker_pb2.JournalSpec.Fragment(
            length=1 << 29,
            compression_codec=broker_pb2.SNAPPY,
            stores=["s3://bucket/prefix/", "file:///var/fragments/"],
            refresh_interval=Duration(seconds=300),
            retention=Duration(seconds=86400 * 30),
            flush_interval=Duration(seconds=3600),
            path_postfix_template='date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}',
        ),
        flags=broker_pb2.JournalSpec.O_RDONLY | broker_pb2.JournalSpec.O_WRONLY,
        max_append_rate=1 << 20,
        suspend=broker_pb2.JournalSpec.Suspend(
            level=broker_pb2.JournalSpec.Suspend.PARTIAL, offset=1234
        ),
    )
    _round_trip(spec)
    assert broker_pb2.JournalSpec.FromString(spec.SerializeToString()).fragment.retention == (
        Duration(seconds=86400 * 30)
    )
    assert broker_pb2.JournalSpec.O_RDWR == 4
    assert broker_pb2.Status.Name(broker_pb2.FRAGMENT_STORE_UNHEALTHY) == (
        "FRAGMENT_STORE_UNHEALTHY"
    )
    assert broker_pb2.CompressionCodec.Value("GZIP_OFFLOAD_DECOMPRESSION") == 5


def test_shard_spec_round_trips() -> None:
    spec = consumer_pb2.ShardSpec(
        id="acme/orders-summary/part-000",
        sources=[consumer_pb2.ShardSpec.Source(journal="acme/orders/part-000", min_offset=10)],
        recovery_log_prefix="acme/recovery",
        hint_prefix="/gazette/hints",
        hint_backups=2,
        max_txn_duration=Duration(seconds=1),
        min_txn_duration=Duration(nanos=10_000_000),
        hot_standbys=1,
        labels=broker_pb2.LabelSet(labels=[broker_pb2.Label(name="app", value="summary")]),
        disable_wait_for_ack=True,
        ring_buffer_size=8192,
        read_channel_size=4096,
    )
    _round_trip(spec)
    checkpoint = consumer_pb2.Checkpoint(
        sources={
            "acme/orders/part-000": consumer_pb2.Checkpoint.Source(
                read_through=4096,
                producers=[
                    consumer_pb2.Checkpoint.Source.ProducerEntry(
                        id=b"\x01\x02\x03\x04\x05\x06",
                        state=consumer_pb2.Checkpoint.ProducerState(last_ack=77, begin=-1),
                    )
                ],
            )
        },
        ack_intents={"acme/summaries/part-000": b"ack"},
    )
    _round_trip(checkpoint)
    assert consumer_pb2.ReplicaStatus.PRIMARY > consumer_pb2.ReplicaStatus.STANDBY


def test_recorded_op_round_trips() -> None:
    ops = [
        recoverylog_pb2.RecordedOp(
            seq_no=1,
            checksum=0xDEADBEEF,
            author=0xFFFFFFFF,
            create=recoverylog_pb2.RecordedOp.Create(path="000001.log"),
        ),
        recoverylog_pb2.RecordedOp(
            seq_no=2, write=recoverylog_pb2.RecordedOp.Write(fnode=1, offset=0, length=512)
        ),
        recoverylog_pb2.RecordedOp(
            seq_no=3, truncate=recoverylog_pb2.RecordedOp.Truncate(fnode=1, size=100)
        ),
        recoverylog_pb2.RecordedOp(
            seq_no=4, link=recoverylog_pb2.RecordedOp.Link(fnode=1, path="MANIFEST")
        ),
        recoverylog_pb2.RecordedOp(
            seq_no=5, unlink=recoverylog_pb2.RecordedOp.Unlink(fnode=1, path="000001.log")
        ),
        recoverylog_pb2.RecordedOp(
            seq_no=6, property=recoverylog_pb2.Property(path="CURRENT", content="MANIFEST\n")
        ),
    ]
    kinds = []
    for op in ops:
        _round_trip(op)
        kinds.append(recoverylog_pb2.RecordedOp.FromString(op.SerializeToString()).WhichOneof("op"))
    assert kinds == ["create", "write", "truncate", "link", "unlink", "property"]

    hints = recoverylog_pb2.FSMHints(
        log="acme/recovery/part-000",
        live_nodes=[
            recoverylog_pb2.FSMHints.FnodeSegments(
                fnode=1,
                segments=[
                    recoverylog_pb2.Segment(
                        author=7, first_seq_no=1, first_offset=0, last_seq_no=5, log="x"
                    )
                ],
            )
        ],
        properties=[recoverylog_pb2.Property(path="CURRENT", content="MANIFEST\n")],
    )
    _round_trip(hints)
    _round_trip(
        consumer_pb2.GetHintsResponse(
            primary_hints=consumer_pb2.GetHintsResponse.ResponseHints(hints=hints),
            backup_hints=[consumer_pb2.GetHintsResponse.ResponseHints()],
        )
    )


class _RecordingChannel:
    """Stands in for a grpc.Channel: records which kind of callable each method asks for."""

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}

    def _kind(self, kind: str) -> Callable[..., object]:
        def make(path: str, *args: Any, **kwargs: Any) -> Callable[..., object]:
            self.kinds[path] = kind
            return lambda *a, **kw: None

        return make

    def __getattr__(self, name: str) -> Callable[..., object]:
        if name in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._kind(name)
        raise AttributeError(name)


JOURNAL_METHODS = {
    "List": "unary_stream",
    "Apply": "unary_unary",
    "Read": "unary_stream",
    "Append": "stream_unary",
    "AppendWhole": "unary_unary",
    "Replicate": "stream_stream",
    "ListFragments": "unary_unary",
}
SHARD_METHODS = dict.fromkeys(["Stat", "List", "Apply", "GetHints", "Unassign"], "unary_unary")


@pytest.mark.parametrize(
    ("module", "grpc_module", "service", "methods"),
    [
        (broker_pb2, broker_pb2_grpc, "Journal", JOURNAL_METHODS),
        (consumer_pb2, consumer_pb2_grpc, "Shard", SHARD_METHODS),
    ],
)
def test_service_shapes(
    module: ModuleType, grpc_module: ModuleType, service: str, methods: dict[str, str]
) -> None:
    descriptor = module.DESCRIPTOR.services_by_name[service]
    shapes = {
        m.name: f"{'stream' if m.client_streaming else 'unary'}_"
        f"{'stream' if m.server_streaming else 'unary'}"
        for m in descriptor.methods
    }
    assert shapes == methods

    channel = _RecordingChannel()
    stub = getattr(grpc_module, f"{service}Stub")(channel)
    package = module.DESCRIPTOR.package
    assert channel.kinds == {f"/{package}.{service}/{name}": kind for name, kind in methods.items()}
    servicer = getattr(grpc_module, f"{service}Servicer")
    for name in methods:
        assert callable(getattr(stub, name))
        assert callable(getattr(servicer, name))
    assert callable(getattr(grpc_module, f"add_{service}Servicer_to_server"))


class _Journal(broker_pb2_grpc.JournalServicer):
    """Serves three of the methods; the base class answers UNIMPLEMENTED to the others."""

    def Apply(
        self, request: broker_pb2.ApplyRequest, context: grpc.ServicerContext
    ) -> broker_pb2.ApplyResponse:
        status = broker_pb2.OK if request.changes else broker_pb2.NOT_ALLOWED
        return broker_pb2.ApplyResponse(status=status)

    def Read(
        self, request: broker_pb2.ReadRequest, context: grpc.ServicerContext
    ) -> Iterator[broker_pb2.ReadResponse]:
        for i in range(3):
            yield broker_pb2.ReadResponse(offset=request.offset + i, content=b"x")

    def Append(
        self, requests: Iterator[broker_pb2.AppendRequest], context: grpc.ServicerContext
    ) -> broker_pb2.AppendResponse:
        first = next(requests)
        size = sum(len(r.content) for r in requests)
        return broker_pb2.AppendResponse(
            commit=broker_pb2.Fragment(journal=first.journal, begin=0, end=size),
            total_chunks=size,
        )


def test_journal_service_over_grpc() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    # The stubs declare every method abstract; at runtime the base class implements them.
    servicer = _Journal()  # type: ignore[abstract]
    broker_pb2_grpc.add_JournalServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = broker_pb2_grpc.JournalStub(channel)
            change = broker_pb2.ApplyRequest.Change(delete="a/journal")
            applied = stub.Apply(broker_pb2.ApplyRequest(changes=[change]), timeout=10)
            assert applied.status == broker_pb2.OK

            reads = list(stub.Read(broker_pb2.ReadRequest(journal="a", offset=5), timeout=10))
            assert [r.offset for r in reads] == [5, 6, 7]

            chunks = [broker_pb2.AppendRequest(journal="a/journal")] + [
                broker_pb2.AppendRequest(content=b"ab") for _ in range(3)
            ]
            appended = stub.Append(iter(chunks), timeout=10)
            assert appended.commit.journal == "a/journal"
            assert appended.commit.end == 6

            with pytest.raises(grpc.RpcError) as info:
                stub.ListFragments(broker_pb2.FragmentsRequest(journal="a"), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(grace=None)
