"""The interface every fragment store implements, and its errors.

A store holds fragments as objects named by `Fragment.path` under the store's URL:
``<journal>/[<postfix>/]<begin>-<end>-<sha1><ext>``. The bytes of an object are the
fragment's *stored* bytes, i.e. compressed with the fragment's codec; stores never look
inside them.

Every failure of the backend (an OS error, an S3 error, a timeout) surfaces as a
`StoreError` naming the store, the operation and the object, so a caller such as the
persister can log it and retry. Bad input from the caller (a journal name that would climb
out of the store, a negative range) is a `ValidationError` / `ValueError` instead: retrying
would not help.
"""

from __future__ import annotations

import abc
import builtins
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import TypeAlias

from gazette import names
from gazette.errors import GazetteError, ValidationError
from gazette.fragment.fragment import Fragment
from gazette.fragment.index import from_listing

#: Size of the chunks `get` streams (at most; a network store may yield smaller ones).
CHUNK_SIZE = 1 << 20

#: What `FragmentStore.put` stores: the stored bytes themselves, or a local file of them.
PutData: TypeAlias = bytes | bytearray | memoryview | os.PathLike[str]


class StoreError(GazetteError):
    """A store operation failed (the store may be down or misconfigured: callers retry).

    `store` is the store URL, `op` the operation (``list``, ``get``, ``put``, ``exists``,
    ``remove``, ``sign``, ``open``), `obj` the object (a fragment path, or a journal for
    ``list``). The backend's exception is chained as ``__cause__``."""

    def __init__(self, store: str, op: str, obj: str, reason: str) -> None:
        self.store, self.op, self.obj, self.reason = store, op, obj, reason
        super().__init__(f"{store}: {op} {obj}: {reason}")


class FragmentNotFound(StoreError):
    """The fragment is not in the store."""


def check_range(begin: int, end: int | None) -> None:
    """Reject a byte range `get` cannot mean (negative, or ending before it begins)."""
    if begin < 0:
        raise ValueError(f"range begin {begin} is negative")
    if end is not None and end < begin:
        raise ValueError(f"range end {end} is before its begin {begin}")


def object_path(fragment: Fragment) -> str:
    """`fragment.path`, checked to be a plain relative path (no ``..``, no leading ``/``):
    `Fragment` does not validate its journal name, and a store must never write or read
    outside its own folder or prefix."""
    names.validate_journal_name(fragment.journal, "fragment.journal")
    if fragment.path_postfix:
        names.validate_path(fragment.path_postfix, "fragment.path_postfix", 1, 512,
                            names.PATH_SYMBOLS + "=")
    return fragment.path


def check_journal(journal: str) -> str:
    """A journal name to list, checked (a ValidationError for one that is no journal)."""
    return names.validate_journal_name(journal, "journal")


def check_prefix(prefix: str) -> str:
    """A journal name prefix to list under, checked: "" or a plain relative path (a
    ValidationError for one that would climb out of the store)."""
    if prefix and (prefix.startswith("/") or ".." in prefix.split("/")
                   or not prefix.rstrip("/")):
        raise ValidationError("prefix", f"{prefix!r} is not a journal name prefix")
    if prefix:
        names.validate_path(prefix.rstrip("/"), "prefix", 1, 512, names.PATH_SYMBOLS)
    return prefix


class SealedFile(os.PathLike[str]):
    """A local file given to `put` that will never change again (a closed spool, or its
    compressed copy, each removed after the put): a store on the same file system may
    link it instead of copying it."""

    __slots__ = ("path",)

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.path = Path(path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __repr__(self) -> str:
        return f"SealedFile({str(self.path)!r})"


#: Bytes held in memory, as `put` accepts them.
Payload: TypeAlias = bytes | bytearray | memoryview


def split_put_data(data: PutData) -> tuple[Payload | None, Path | None]:
    """`put`'s data as (the bytes, None) or (None, the local file holding them)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return data, None
    if isinstance(data, os.PathLike):
        return None, Path(data)
    raise TypeError(f"put: expected bytes or a path, got {type(data).__name__}")


class FragmentStore(abc.ABC):
    """A BLOB store of fragments, named by `Fragment.path` under the store's `url`.

    All operations are coroutines and never block the event loop. A store may be used by
    many tasks at once; `close` releases its connections (the store can be used again
    afterwards: it reconnects lazily).
    """

    #: The store URL (``file:///sub/dir/`` or ``s3://bucket/prefix/?...``), exactly as
    #: journal specs name it; listed fragments carry it as their `backing_store`.
    url: str

    async def list(self, journal: str) -> list[Fragment]:
        """The fragments of `journal` in this store, with their `mod_time` and
        `backing_store` (= `url`), in no particular order.

        Everything under ``<journal>/`` is listed, recursively, so fragments in postfix
        folders (``<journal>/date=.../<name>``) are found; fragments of other journals
        whose names extend this one (``<journal>/child/...``) are left out, and objects
        that are not fragments are logged and skipped."""
        found = await self.list_paths(check_journal(journal) + "/")
        return [f for f in from_listing(found, self.url) if f.journal == journal]

    async def list_under(self, prefix: str = "") -> builtins.list[Fragment]:
        """The fragments of every journal whose name starts with `prefix` (all with
        ""), as `list` gives them, in no particular order: for readers that find
        journals in a store without a broker (the Spark source)."""
        found = await self.list_paths(check_prefix(prefix))
        return [f for f in from_listing(found, self.url) if f.path.startswith(prefix)]

    @abc.abstractmethod
    async def list_paths(self, prefix: str) -> builtins.list[tuple[str, int]]:
        """(path within the store, mod time in Unix seconds) of every object whose path
        starts with `prefix` (checked by the caller); `StoreError` (op ``list``) if the
        store cannot be listed."""

    @abc.abstractmethod
    def get(self, fragment: Fragment, begin: int = 0,
            end: int | None = None) -> AsyncIterator[bytes]:
        """The stored (compressed) bytes ``[begin, end)`` of the fragment's object (`end`
        None: to the end of the object), streamed in chunks of at most `CHUNK_SIZE`.

        A range past the end of the object is cut short, as a slice would be. Errors
        surface while iterating: `FragmentNotFound` if the object does not exist, else
        `StoreError`. Iterate to the end or `aclose()` the iterator to release the
        connection or file promptly."""

    @abc.abstractmethod
    async def put(self, fragment: Fragment, data: PutData) -> None:
        """Store the fragment's stored (compressed) bytes, given as bytes or as the path
        of a local file holding them. Atomic: a reader sees no object or the whole
        object, never part of one (a put that fails leaves nothing behind, and a put of
        an existing fragment replaces it whole). A put that is cancelled may still
        complete in the background."""

    @abc.abstractmethod
    async def exists(self, fragment: Fragment) -> bool:
        """Whether the fragment's object is in the store."""

    @abc.abstractmethod
    async def remove(self, fragment: Fragment) -> None:
        """Delete the fragment's object. Removing one that does not exist succeeds (S3
        cannot tell, and retention may race with another broker doing the same)."""

    @abc.abstractmethod
    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        """A URL a client can fetch the stored fragment from itself, valid for about
        `ttl` (stores that cannot expire URLs ignore it). It does not check that the
        fragment exists."""

    async def close(self) -> None:  # noqa: B027 - optional: most stores hold nothing
        """Release connections; the store reconnects if it is used again."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def not_a_store(url: str, reason: str) -> ValidationError:
    """The error for a store URL that cannot be opened as configured."""
    return ValidationError("store", f"{url!r}: {reason}")
