"""Gazette for Python: journals, messages, consumers and events.

This is the application author's face: everything an application needs is importable
from here (``from gazette import Application, JournalClient, Publisher``), each name
loaded on first use, so ``import gazette`` costs nothing. The packages below
(`gazette.client`, `gazette.consumer`, `gazette.message`, ...) hold the same names and
the machinery the services are built of. See docs/api.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gazette.errors import GazetteError, ValidationError

if TYPE_CHECKING:
    from gazette.client import (
        AppendQueue,
        AppendResult,
        AppendUncertain,
        BrokerError,
        JournalClient,
        ReadChunk,
        RetryPolicy,
        ShardClient,
        Unavailable,
    )
    from gazette.consumer import (
        Application,
        JSONFileStore,
        MemoryStore,
        Shard,
        SQLiteStore,
        SQLStore,
        Store,
    )
    from gazette.events import Event, Events, OnFailure, Topic
    from gazette.labels import LabelSet, Selector
    from gazette.message import (
        DataclassMessage,
        Envelope,
        JsonMessage,
        Message,
        Publisher,
        StaticPartitions,
    )
    from gazette.protocol import JournalSpec, ShardSource, ShardSpec, ShardStatus, Status

#: Each name of the face -> the package it is loaded from.
_FACE = {
    **dict.fromkeys(("AppendQueue", "AppendResult", "AppendUncertain", "BrokerError",
                     "JournalClient", "ReadChunk", "RetryPolicy", "ShardClient",
                     "Unavailable"), "gazette.client"),
    **dict.fromkeys(("Application", "JSONFileStore", "MemoryStore", "SQLStore",
                     "SQLiteStore", "Shard", "Store"), "gazette.consumer"),
    **dict.fromkeys(("Event", "Events", "OnFailure", "Topic"), "gazette.events"),
    **dict.fromkeys(("LabelSet", "Selector"), "gazette.labels"),
    **dict.fromkeys(("DataclassMessage", "Envelope", "JsonMessage", "Message", "Publisher",
                     "StaticPartitions"), "gazette.message"),
    **dict.fromkeys(("JournalSpec", "ShardSource", "ShardSpec", "ShardStatus", "Status"),
                    "gazette.protocol"),
}


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'gazette' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACE})


__all__ = [
    "AppendQueue",
    "AppendResult",
    "AppendUncertain",
    "Application",
    "BrokerError",
    "DataclassMessage",
    "Envelope",
    "Event",
    "Events",
    "GazetteError",
    "JSONFileStore",
    "JournalClient",
    "JournalSpec",
    "JsonMessage",
    "LabelSet",
    "MemoryStore",
    "Message",
    "OnFailure",
    "Publisher",
    "ReadChunk",
    "RetryPolicy",
    "SQLStore",
    "SQLiteStore",
    "Selector",
    "Shard",
    "ShardClient",
    "ShardSource",
    "ShardSpec",
    "ShardStatus",
    "StaticPartitions",
    "Status",
    "Store",
    "Topic",
    "Unavailable",
    "ValidationError",
]
