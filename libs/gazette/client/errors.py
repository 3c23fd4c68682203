"""What the journal client raises: each error names the journal (and, for refusals, the
broker's status), so a log line says what failed where without a stack trace."""

from __future__ import annotations

from collections.abc import Sequence

from gazette.errors import GazetteError
from gazette.protocol.status import Status


class BrokerError(GazetteError):
    """The broker refused a request: `status` is the protocol's `Status` such as
    `Status.JOURNAL_NOT_FOUND` (or, for a failure that is not a status, the gRPC code
    name, e.g. ``DATA_LOSS`` for a corrupt stored fragment). Nothing was written."""

    def __init__(self, status: Status | str, journal: str = "", detail: str = "") -> None:
        self.status, self.journal, self.detail = status, journal, detail
        where = f" for journal {journal}" if journal else ""
        super().__init__(f"{status}{where}" + (f": {detail}" if detail else ""))

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        return isinstance(self.status, Status) and self.status.retriable

    @property
    def route_changing(self) -> bool:
        """Whether the journal's route was changing: the client retries these itself."""
        return isinstance(self.status, Status) and self.status.route_changing


class ApplyConflict(BrokerError):
    """A change's expected mod revision was stale (``ETCD_TRANSACTION_FAILED``): a spec
    changed since it was read, and nothing was applied. `revision` is etcd's revision
    when the transaction failed; list again and retry."""

    def __init__(self, revision: int, journals: Sequence[str] = ()) -> None:
        self.revision = revision
        super().__init__(Status.ETCD_TRANSACTION_FAILED, ", ".join(journals),
                         f"a spec changed since it was read (etcd is at revision "
                         f"{revision}); nothing was applied")


class AppendUncertain(GazetteError):
    """The commit of an append was sent but no answer came: it may or may not have
    committed. Appends with an expected `offset` are resolved by the client instead
    (see docs/client.md), so this is only raised for appends without one (or whose
    content was streamed and cannot be sent again)."""

    retriable = True  # sent again with its offset, it is resolved: see docs/client.md

    def __init__(self, journal: str, detail: str, offset: int | None = None) -> None:
        self.journal, self.offset = journal, offset
        super().__init__(f"append to {journal} is uncertain: {detail}; it may or may not "
                         f"have committed")


class Unavailable(GazetteError):
    """The broker could not be reached, or kept failing, after every retry. `code` is the
    last gRPC status code name (e.g. ``UNAVAILABLE``)."""

    retriable = True

    def __init__(self, op: str, address: str, code: str, detail: str, journal: str = "",
                 attempts: int = 1) -> None:
        self.op, self.address, self.code, self.journal = op, address, code, journal
        what = f"{op} of {journal}" if journal else op
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"{what} via broker {address} failed{tries}: {code}: {detail}")
