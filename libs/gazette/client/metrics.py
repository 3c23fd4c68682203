"""The client's Prometheus counters (process-wide, no per-journal labels: a process may
write to thousands of journals)."""

from __future__ import annotations

from prometheus_client import Counter

APPENDS = Counter("gazette_client_appends_total",
                  "Appends committed by this process's journal clients")
APPEND_BYTES = Counter("gazette_client_append_bytes_total",
                       "Bytes of appends committed by this process's journal clients")
APPEND_RPCS = Counter("gazette_client_append_queue_rpcs_total",
                      "Append RPCs sent by AppendQueues (each carries one or more appends)")
RETRIES = Counter("gazette_client_retries_total",
                  "Requests tried again after a transport failure, by operation", ["op"])
READ_BYTES = Counter("gazette_client_read_bytes_total",
                     "Journal content read, by where it came from (broker or store)",
                     ["source"])
