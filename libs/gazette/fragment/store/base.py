"""The interface every fragment store implements, and its errors."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from datetime import timedelta

from gazette.errors import GazetteError
from gazette.fragment.fragment import Fragment

#: Size of the chunks `get` streams.
CHUNK_SIZE = 1 << 20


class StoreError(GazetteError):
    """A store operation failed (the store may be down: callers retry)."""

    def __init__(self, store: str, op: str, obj: str, reason: str) -> None:
        self.store, self.op, self.obj = store, op, obj
        super().__init__(f"{store}: {op} {obj}: {reason}")


class FragmentNotFound(StoreError):
    """The fragment is not in the store."""


class FragmentStore(abc.ABC):
    """A BLOB store of fragments, named by `Fragment.path` under the store's URL."""

    url: str

    @abc.abstractmethod
    async def list(self, journal: str) -> list[Fragment]:
        """The fragments of `journal` in this store (other keys are skipped)."""

    @abc.abstractmethod
    def get(self, fragment: Fragment, begin: int = 0,
            end: int | None = None) -> AsyncIterator[bytes]:
        """Stored (compressed) bytes [begin, end) of the fragment, in chunks."""

    @abc.abstractmethod
    async def put(self, fragment: Fragment, data: bytes) -> None:
        """Store the fragment's (compressed) bytes atomically: readers see all or none."""

    @abc.abstractmethod
    async def exists(self, fragment: Fragment) -> bool: ...

    @abc.abstractmethod
    async def remove(self, fragment: Fragment) -> None: ...

    @abc.abstractmethod
    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        """A URL a client can fetch the stored fragment from itself, for `ttl`."""

    async def close(self) -> None:  # noqa: B027 - optional: most stores hold nothing
        """Release connections."""
