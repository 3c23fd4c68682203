"""The journal client: appends (with safe retries), following reads, direct fragment
reads, listings and spec changes against a broker, and the `AppendQueue` the message
library's Publisher appends through. See docs/client.md."""

from gazette.client.errors import AppendUncertain, ApplyConflict, BrokerError, Unavailable
from gazette.client.fetch import fetch_fragment
from gazette.client.journal import (
    AppendResult,
    FragmentInfo,
    JournalClient,
    ListedJournal,
    Listing,
    ReadChunk,
    RetryPolicy,
    Route,
    parse_address,
)
from gazette.client.queue import AppendQueue

__all__ = [
    "AppendQueue",
    "AppendResult",
    "AppendUncertain",
    "ApplyConflict",
    "BrokerError",
    "FragmentInfo",
    "JournalClient",
    "ListedJournal",
    "Listing",
    "ReadChunk",
    "RetryPolicy",
    "Route",
    "Unavailable",
    "fetch_fragment",
    "parse_address",
]
