"""The gRPC Journal service over this broker's replicas.

Refusals the protocol names (unknown journal, wrong offset, register mismatch, not
allowed, offset not yet available) are answered with their `Status` in the response;
malformed requests fail with INVALID_ARGUMENT and a message naming the field; a corrupt
stored fragment fails the read with DATA_LOSS. The broker keeps serving in every case.

In a cluster (a `Broker` with a resolver), any broker takes any request: an append goes
to the journal's primary and a read to one of its replicas (this broker's own, else one
in its zone), forwarded by this broker unless the request says `do_not_proxy` (then the
status names the problem and the header carries the route to retry at). A request's
header pins an etcd revision: the broker first catches up with it. Peers' Replicate
streams are verified against this broker's route of the journal (WRONG_ROUTE if not).
"""

from __future__ import annotations

from typing import Any

import grpc

from gazette.auth import Capability
from gazette.pb import broker_pb2_grpc
from gazette.protocol import decode_append_request, decode_replicate_request, encode_read_response
from gazette.serving.malformed_guard import add_guarded
from gazette_broker.routing import JournalRouting
from gazette_broker.service_appends import AppendRpcs
from gazette_broker.service_reads import ReadRpcs
from gazette_broker.service_specs import SpecRpcs

_JOURNAL = "/gazette.broker.Journal/"
#: The capability each method needs (the health service is open: `gazette.auth.OPEN_METHODS`).
JOURNAL_CAPABILITIES: dict[str, Capability | None] = {
    _JOURNAL + "List": Capability.LIST,
    _JOURNAL + "Apply": Capability.APPLY,
    _JOURNAL + "Read": Capability.READ,
    _JOURNAL + "ListFragments": Capability.READ,
    _JOURNAL + "Append": Capability.APPEND,
    _JOURNAL + "AppendWhole": Capability.APPEND,
    _JOURNAL + "Replicate": Capability.REPLICATE,
}


def add_journal_service(service: JournalService, server: grpc.aio.Server) -> None:
    """Serve `service` on `server` as the generated registration does, except that the
    content of appends and reads is copied once (`gazette.protocol.content`): Append
    and AppendWhole requests arrive as `AppendContent`, Read responses may be
    `ReadContent`."""

    def adjust(handlers: dict[str, Any]) -> None:
        handlers["Read"] = handlers["Read"]._replace(response_serializer=encode_read_response)
        handlers["Replicate"] = handlers["Replicate"]._replace(
            request_deserializer=decode_replicate_request)
        for method in ("Append", "AppendWhole"):
            handlers[method] = handlers[method]._replace(
                request_deserializer=decode_append_request)

    # Malformed requests: INVALID_ARGUMENT naming the field (`gazette.serving.malformed_guard`).
    add_guarded(broker_pb2_grpc.add_JournalServicer_to_server, service, server, adjust)


class JournalService:
    """The gRPC Journal service of a broker: specs (`SpecRpcs`), appends and
    replication (`AppendRpcs`), reads and fragments (`ReadRpcs`), each in its own module
    and each holding the `routing` they share."""

    def __init__(self, routing: JournalRouting) -> None:
        self.routing = routing
        specs, appends, reads = SpecRpcs(routing), AppendRpcs(routing), ReadRpcs(routing)
        # The registration looks the methods up by name, and grpc.aio (and the guard of
        # malformed requests) tells coroutines from async generators by their kind: the
        # parts' own methods, not wrappers.
        self.List, self.Apply = specs.List, specs.Apply
        self.Append, self.AppendWhole = appends.Append, appends.AppendWhole
        self.Replicate = appends.Replicate
        self.Read, self.ListFragments = reads.Read, reads.ListFragments
