"""Fragment stores: ``file:///`` under the broker's file root and ``s3://`` buckets,
behind one interface (`FragmentStore`: list, get with a range, put, exists, remove, sign).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gazette.errors import ValidationError
from gazette.fragment.store.base import FragmentNotFound, FragmentStore, StoreError
from gazette.fragment.store.file import FileStore
from gazette.fragment.store.s3 import S3Store
from gazette.protocol import validate_store_url

__all__ = ["FileStore", "FragmentNotFound", "FragmentStore", "S3Store", "StoreError",
           "store_for"]


def store_for(url: str, *, file_root: Path | None = None,
              env: Mapping[str, str] | None = None) -> FragmentStore:
    """The store a (validated) store URL names."""
    validate_store_url(url, "store")
    if url.startswith("file:"):
        if file_root is None:
            raise ValidationError("store", f"{url!r}: file stores need a file root "
                                  "(--broker.file-root is not set)")
        return FileStore(url, file_root)
    return S3Store(url, env)
