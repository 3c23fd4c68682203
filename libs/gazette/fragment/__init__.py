"""Fragments of journals: naming, codecs, the fragment index; stores in
`gazette.fragment.store`.

A fragment is a byte range of a journal holding whole appends, named in stores by
``<journal>/<begin>-<end>-<sha1><ext>``; see `Fragment`.
"""

from gazette.fragment.cache import FragmentCache
from gazette.fragment.codec import (
    CodecError,
    Compressor,
    CorruptFragment,
    Decompressor,
    Sha1Verifier,
    compress,
    decompress,
)
from gazette.fragment.fragment import (
    CODEC_EXTENSIONS,
    EMPTY_SHA1,
    NO_SHA1,
    Fragment,
    fragment_from_pb,
    fragment_to_pb,
)
from gazette.fragment.index import FragmentSet, JournalClosed, JournalIndex, from_listing
from gazette.fragment.persister import DEFAULT_MAX_PENDING_BYTES, Persister
from gazette.fragment.spool import ClosedSpool, Spool, read_file
from gazette.fragment.summer import ThreadedSha1

__all__ = [
    "CODEC_EXTENSIONS",
    "DEFAULT_MAX_PENDING_BYTES",
    "EMPTY_SHA1",
    "NO_SHA1",
    "ClosedSpool",
    "CodecError",
    "Compressor",
    "CorruptFragment",
    "Decompressor",
    "Fragment",
    "FragmentCache",
    "FragmentSet",
    "JournalClosed",
    "JournalIndex",
    "Persister",
    "Sha1Verifier",
    "Spool",
    "ThreadedSha1",
    "compress",
    "decompress",
    "fragment_from_pb",
    "fragment_to_pb",
    "from_listing",
    "read_file",
]
