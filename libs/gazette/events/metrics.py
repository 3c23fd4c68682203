"""Prometheus metrics of the events library (served by whatever exposes the process's
default registry: a consumer member's ``/metrics``, or the application's own)."""

from prometheus_client import Counter, Gauge, Histogram

PRODUCED = Counter("gazette_events_produced_total",
                   "Events appended to a topic's journals, by topic and path "
                   "(direct: outside a transaction; outbox; catch_up: swept from the outbox)",
                   ["topic", "path"])
CONSUMED = Counter("gazette_events_consumed_total",
                   "Events a handler processed successfully, by group, topic and handler "
                   "(broadcast handlers have group \"\")", ["group", "topic", "handler"])
SKIPPED = Counter("gazette_events_duplicates_total",
                  "Events an exactly-once handler skipped: their id was processed before",
                  ["group", "topic", "handler"])
FAILURES = Counter("gazette_events_failures_total",
                   "Handler failures (an exception, a timeout or a type mismatch), by the "
                   "policy that took them", ["group", "topic", "handler", "policy"])
HANDLER_SECONDS = Histogram("gazette_events_handler_seconds",
                            "Seconds of one handler invocation (one event or one batch)",
                            ["group", "handler"],
                            buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5,
                                     1, 2.5, 5, 10, 30))
OUTBOX_DEPTH = Gauge("gazette_events_outbox_depth",
                     "Rows in the outbox table, as the catch-up producer last counted them")
DEAD_LETTERS = Counter("gazette_events_dead_letters_total",
                       "Events saved to a group's dead-letter journal (a person inspects and "
                       "replays them)", ["group", "topic", "handler"])
BROADCAST_LAG = Gauge("gazette_events_broadcast_lag_bytes",
                      "Bytes a broadcast reader is behind the write head, by journal",
                      ["journal"])


def count_handler(group: str, topic: str, handler: str, policy: str) -> None:
    """Export a new handler's failure and dead-letter counters at 0: an alert on their
    increase then sees the first one (a series that appears with value 1 has none)."""
    FAILURES.labels(group, topic, handler, policy)
    DEAD_LETTERS.labels(group, topic, handler)
    SKIPPED.labels(group, topic, handler)
