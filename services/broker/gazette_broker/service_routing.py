"""The gRPC edge of routing: a request's journal resolved (`JournalRouting.resolve`)
and its caller authorized, with the typed refusals turned into gRPC answers.
"""

from __future__ import annotations

from typing import Any

import grpc

from gazette.auth import current_caller, require_scope
from gazette.errors import ValidationError
from gazette.labels import EMPTY, journal_labels
from gazette.pb import broker_pb2 as pb
from gazette.protocol import JournalSpec
from gazette_broker.routing import JournalRouting, JournalUnready, Routed


async def resolved(routing: JournalRouting, journal: str, header: pb.Header | None,
                   context: Any) -> Routed:
    """`journal` resolved for an RPC whose caller's token must cover it; aborts with
    INVALID_ARGUMENT (a bad name or header), UNAVAILABLE (not servable yet) or
    PERMISSION_DENIED."""
    try:
        routed = await routing.resolve(journal, header)
    except ValidationError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    except JournalUnready as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, err.reason)
    await authorize(journal, routed.spec, context)
    return routed


async def authorize(journal: str, spec: JournalSpec | None, context: Any) -> None:
    """Abort (PERMISSION_DENIED) unless the caller's token covers `journal` (by its
    labels; one without a spec by its name alone)."""
    if current_caller().claims.scoped:
        await require_scope(context, journal_labels(
            journal, spec.labels if spec is not None else EMPTY), f"journal {journal}")


def pinned(request: Any) -> pb.Header | None:
    """The header of `request`, if it carries one (it pins an etcd revision)."""
    return request.header if request.HasField("header") else None
