"""The journal client: appends (retried only where that cannot append twice), following
reads that resume after failures, direct reads of persisted fragments, listings, watches
and spec changes against a broker, and the `AppendQueue` that the message library's
Publisher appends through; `ShardClient`, the same for consumer shards against a
consumer member. See docs/client.md."""

from gazette.client.appends import AppendContent
from gazette.client.errors import AppendUncertain, ApplyConflict, BrokerError, Unavailable
from gazette.client.fetch import FetchError, fetch_fragment
from gazette.client.journal import JournalClient
from gazette.client.queue import AppendQueue, QueueClosed
from gazette.client.results import AppendResult, ReadChunk
from gazette.client.retry import RETRYABLE_STATUSES, RetryPolicy
from gazette.client.shards import (
    ListedShard,
    ShardApplyConflict,
    ShardClient,
    ShardError,
    ShardHints,
    ShardStat,
    ShardUnavailable,
)
from gazette.client.specs import Applied, FragmentInfo, ListedJournal, Listing
from gazette.client.wire import parse_address
from gazette.protocol import Route

__all__ = [
    "RETRYABLE_STATUSES",
    "AppendContent",
    "AppendQueue",
    "AppendResult",
    "AppendUncertain",
    "Applied",
    "ApplyConflict",
    "BrokerError",
    "FetchError",
    "FragmentInfo",
    "JournalClient",
    "ListedJournal",
    "ListedShard",
    "Listing",
    "QueueClosed",
    "ReadChunk",
    "RetryPolicy",
    "Route",
    "ShardApplyConflict",
    "ShardClient",
    "ShardError",
    "ShardHints",
    "ShardStat",
    "ShardUnavailable",
    "Unavailable",
    "fetch_fragment",
    "parse_address",
]
