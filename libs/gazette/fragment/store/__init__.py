"""Fragment stores: ``file:///`` under the broker's file root and ``s3://`` buckets,
behind one interface (`FragmentStore`: list, get with a range, put, exists, remove, sign).

`store_for` opens the store a journal spec's store URL names. Failures of a store surface
as `StoreError` (`FragmentNotFound` for a missing fragment); a URL that cannot be opened
as configured is a `ValidationError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gazette.fragment.store.base import (
    CHUNK_SIZE,
    FragmentNotFound,
    FragmentStore,
    PutData,
    SealedFile,
    StoreError,
    not_a_store,
)
from gazette.fragment.store.file import FileStore
from gazette.protocol import validate_store_url

if TYPE_CHECKING:
    from gazette.fragment.store.s3 import S3ClientPool, S3Store, aclose_all, client_pool

#: Loaded on first use: aiobotocore takes ~0.2 s to import, which every gazctl command
#: would pay, though most never touch S3.
_S3_NAMES = ("S3ClientPool", "S3Store", "aclose_all", "client_pool")


def __getattr__(name: str) -> Any:
    if name in _S3_NAMES:
        from gazette.fragment.store import s3
        return getattr(s3, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CHUNK_SIZE",
    "FileStore",
    "FragmentNotFound",
    "FragmentStore",
    "PutData",
    "S3ClientPool",
    "S3Store",
    "SealedFile",
    "StoreError",
    "aclose_all",
    "client_pool",
    "store_for",
]


def store_for(url: str, *, file_root: Path | None = None,
              env: Mapping[str, str] | None = None,
              s3_options: Mapping[str, Any] | None = None) -> FragmentStore:
    """The store `url` names: a `FileStore` under `file_root` (the broker's
    ``--broker.file-root``) for ``file:///...``, an `S3Store` for ``s3://...`` configured
    from the URL and `env` (default ``os.environ``) with `s3_options` (keyword arguments
    of `S3Store`: timeouts, retries, part sizes).

    Cheap and synchronous: nothing is contacted until the store is used. Raises
    ValidationError for a bad URL, or a file store without a file root."""
    validate_store_url(url, "store")
    if url.startswith("file:"):
        if file_root is None:
            raise not_a_store(url, "file:// stores need the broker's file root "
                              "(--broker.file-root is not set)")
        return FileStore(url, file_root)
    from gazette.fragment.store.s3 import S3Store
    return S3Store(url, env, **(s3_options or {}))
