"""What the journal client raises."""

from __future__ import annotations

from gazette.errors import GazetteError


class BrokerError(GazetteError):
    """The broker refused a request with a protocol status (e.g. JOURNAL_NOT_FOUND)."""

    def __init__(self, status: str, journal: str = "", detail: str = "") -> None:
        self.status, self.journal = status, journal
        where = f" ({journal})" if journal else ""
        super().__init__(f"{status}{where}" + (f": {detail}" if detail else ""))


class ApplyConflict(BrokerError):
    """An expected mod revision was stale: a spec changed since it was read."""

    def __init__(self, revision: int) -> None:
        self.revision = revision
        super().__init__("ETCD_TRANSACTION_FAILED", "",
                         f"a spec changed since it was read (etcd is at revision {revision})")


class AppendUncertain(GazetteError):
    """The commit of an append was sent but no answer came: it may or may not have
    committed. Retry with an expected offset to make appends resolvable."""


class Unavailable(GazetteError):
    """The broker could not be reached (after retries)."""
