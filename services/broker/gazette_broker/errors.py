"""Errors the broker answers with a protocol status."""

from __future__ import annotations

from gazette.errors import GazetteError
from gazette.protocol import Status


class StatusError(GazetteError):
    """A refusal the protocol names by its `status`; nothing was written."""

    def __init__(self, status: Status, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(f"{status}: {message}")

    @property
    def retriable(self) -> bool:  # type: ignore[override]
        return self.status.retriable


class AppendError(StatusError):
    """An append was refused; nothing was written."""


class AppendStalled(GazetteError):
    """An append stream brought no content for too long: it was aborted, nothing was
    written."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"no content for {timeout:.0f}s: the append was aborted; nothing "
                         "was appended")
