"""Errors the broker answers with a protocol status."""

from __future__ import annotations

from gazette.errors import GazetteError


class StatusError(GazetteError):
    """A refusal the protocol names: `status` is a broker `Status` name."""

    def __init__(self, status: str, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(f"{status}: {message}")
