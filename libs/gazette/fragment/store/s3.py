"""``s3://bucket/prefix/`` stores, through aiobotocore.

Fragments are the objects ``<prefix><journal>/[<postfix>/]<name>`` of the bucket (the
prefix is the URL's path, percent-decoded, without its leading ``/``). Query parameters
of the store URL:

* ``endpoint``: an S3-compatible server (MinIO, moto, ...), e.g. ``http://minio:9000``;
* ``region``: the bucket's region; ``profile``: an AWS profile of the config files;
* ``storage_class``, ``sse`` (``ServerSideEncryption``) and ``acl``: applied to puts.

Without them, the standard AWS settings apply, read from `env` (``os.environ`` unless
given): ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_REGION`` /
``AWS_DEFAULT_REGION``, ``AWS_PROFILE``, ``AWS_CONFIG_FILE``,
``AWS_SHARED_CREDENTIALS_FILE``, and credentials ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` (unless the URL names a ``profile``,
which then wins). Anything else of botocore's credential chain (web identity, SSO,
container and instance metadata) reads the process environment as usual.

Addressing is path-style (``endpoint/bucket/key``, what MinIO and moto expect) when an
endpoint is configured, else botocore's choice (the profile's ``s3.addressing_style`` or
virtual-host style); ``AWS_S3_ADDRESSING_STYLE`` (``path``, ``virtual``, ``auto``) or the
`addressing_style` argument overrides both. Signatures are SigV4.

Clients. Stores with equal client settings share one aiobotocore client (and its
connection pool) per event loop: `gazette.fragment.store.s3_clients`.

Timeouts and retries. botocore retries throttling, 5xx and connection errors itself
("standard" mode, `max_attempts` attempts in all), each attempt bounded by
`connect_timeout` and `read_timeout`; every call is also bounded by `op_timeout` as a
whole (and each chunk of a get), so a hung endpoint fails the operation with a
`StoreError` rather than blocking the caller, who retries (the persister does, forever).
Puts do not send ``Expect: 100-continue``: aiohttp waits for the ``100 Continue`` of a
frozen server with no read timeout at all, so it would hang until `op_timeout`.

Puts. Up to `multipart_threshold` bytes, one PutObject; larger objects are uploaded in
parts of `part_size` (a multipart upload, read from a local file one part at a time in a
worker thread): S3 makes either visible whole, on completion, never partially. A failed
or cancelled multipart upload is aborted (best effort: a bucket lifecycle rule
"AbortIncompleteMultipartUpload" should collect what a crash leaves). Every object gets
``Content-Type: application/octet-stream``. ``Content-Encoding: gzip`` is set only for
the GZIP_OFFLOAD_DECOMPRESSION codec, as Gazette does: that codec exists so that HTTP
clients of signed URLs (and stores that transcode, like GCS) decompress transparently.
Plain GZIP fragments get no Content-Encoding, so every client sees the stored bytes the
fragment's codec and SHA-1 describe. Our own `get` always yields the stored bytes (the
client sends ``Accept-Encoding: identity`` and never decompresses).
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from gazette.fragment.fragment import Fragment
from gazette.fragment.store.base import (
    CHUNK_SIZE,
    FragmentNotFound,
    FragmentStore,
    Payload,
    PutData,
    StoreError,
    check_range,
    not_a_store,
    object_path,
    split_put_data,
)
from gazette.fragment.store.s3_clients import (
    ClientSettings,
    PooledClient,
    S3ClientPool,
    aclose_all,
    client_pool,
)
from gazette.protocol import CompressionCodec, validate_store_url

__all__ = ["ADDRESSING_STYLES", "MAX_SIGN_TTL", "ClientSettings", "S3ClientPool", "S3Store",
           "aclose_all", "client_pool"]

log = logging.getLogger(__name__)

MiB = 1 << 20
#: S3's smallest part (but the last) and largest number of parts of a multipart upload.
MIN_PART_SIZE, MAX_PARTS = 5 * MiB, 10_000
#: The longest a SigV4 presigned URL may live.
MAX_SIGN_TTL = timedelta(days=7)
ADDRESSING_STYLES = ("auto", "path", "virtual")

_NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
#: What an S3 call raises when it fails (TimeoutError, an OSError: our own bound,
#: `op_timeout`; aiohttp errors aiobotocore did not wrap).
_FAILURES = (BotoCoreError, ClientError, aiohttp.ClientError, OSError)


def _error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


# -- the store -------------------------------------------------------------------------


class S3Store(FragmentStore):
    """Fragments as objects of an S3 bucket (see the module doc)."""

    def __init__(self, url: str, env: Mapping[str, str] | None = None, *,
                 connect_timeout: float = 10.0, read_timeout: float = 60.0,
                 max_attempts: int = 3, op_timeout: float = 300.0,
                 addressing_style: str | None = None,
                 part_size: int = 16 * MiB, multipart_threshold: int = 32 * MiB,
                 max_connections: int = 32) -> None:
        validate_store_url(url, "store")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "s3":
            raise not_a_store(url, "not an s3:// store")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size {part_size} is below S3's minimum {MIN_PART_SIZE}")
        if min(connect_timeout, read_timeout, op_timeout) <= 0 or max_attempts < 1:
            raise ValueError("timeouts must be positive and max_attempts at least 1")
        self.url = url
        self.bucket = parts.netloc
        #: Key prefix of every object ("" or ending in "/").
        self.prefix = urllib.parse.unquote(parts.path).lstrip("/")
        #: Bound on any one call as a whole (and on each chunk of a get).
        self.op_timeout = op_timeout
        self.part_size, self.multipart_threshold = part_size, multipart_threshold
        query = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items() if v[0]}
        env = os.environ if env is None else env

        endpoint = query.get("endpoint")
        ignore_env_endpoint = env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower()
        if endpoint is None and ignore_env_endpoint != "true":
            endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if endpoint is not None:
            ep = urllib.parse.urlsplit(endpoint)
            if ep.scheme not in ("http", "https") or not ep.netloc:
                raise not_a_store(url, f"endpoint {endpoint!r} is not an http(s):// URL")
        style = addressing_style or env.get("AWS_S3_ADDRESSING_STYLE") or (
            "path" if endpoint else None)
        if style is not None and style not in ADDRESSING_STYLES:
            raise not_a_store(url, f"addressing style {style!r} is not one of "
                              f"{', '.join(ADDRESSING_STYLES)}")
        profile = query.get("profile")
        credentials = None
        key_id, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if profile is None and key_id and secret:
            credentials = (key_id, secret, env.get("AWS_SESSION_TOKEN") or None)
        self.settings = ClientSettings(
            endpoint=endpoint,
            region=query.get("region") or env.get("AWS_REGION")
            or env.get("AWS_DEFAULT_REGION") or None,
            # From os.environ, botocore reads AWS_PROFILE itself: naming it explicitly
            # would also switch off the environment's web identity (IRSA) settings.
            profile=profile or (env.get("AWS_PROFILE") if env is not os.environ else None)
            or None,
            addressing_style=style,
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            max_attempts=max_attempts, max_connections=max_connections,
            config_file=env.get("AWS_CONFIG_FILE") or None,
            credentials_file=env.get("AWS_SHARED_CREDENTIALS_FILE") or None,
            credentials=credentials,
        )
        self._put_args = {k: v for k, v in (("StorageClass", query.get("storage_class")),
                                            ("ServerSideEncryption", query.get("sse")),
                                            ("ACL", query.get("acl"))) if v}
        self._lease: PooledClient | None = None
        self._background: set[asyncio.Future[None]] = set()

    # -- the client --------------------------------------------------------------------

    async def client(self) -> Any:
        """The aiobotocore S3 client of this store (shared with the running loop's other
        stores of equal settings), opened on first use. Do not close it yourself."""
        loop = asyncio.get_running_loop()
        lease = self._lease
        if lease is not None and not lease.closed and lease.loop is loop:
            return lease.client
        pool = client_pool()
        entry = await pool.acquire(self.settings)
        current = self._lease
        if (current is not None and current is not lease and not current.closed
                and current.loop is loop):
            await pool.release(entry)  # another task of this store got one meanwhile
            return current.client
        # A lease of another (likely closed) loop cannot be released from here; drop it.
        self._lease = entry
        return entry.client

    async def close(self) -> None:
        """Drop this store's reference to its client (the last user closes it)."""
        lease, self._lease = self._lease, None
        # (A lease of another loop cannot be released from this one; it is dropped.)
        if (lease is not None and not lease.closed
                and lease.loop is asyncio.get_running_loop()):
            await lease.pool.release(lease)

    # -- helpers -----------------------------------------------------------------------

    def _key(self, fragment: Fragment) -> str:
        return self.prefix + object_path(fragment)

    def _fail(self, op: str, obj: str, exc: BaseException) -> StoreError:
        cls = FragmentNotFound if _error_code(exc) in _NOT_FOUND else StoreError
        if isinstance(exc, TimeoutError) and not isinstance(exc, BotoCoreError):
            reason = f"no answer within {self.op_timeout:g}s"
        else:
            reason = f"{type(exc).__name__}: {exc}"
        return cls(self.url, op, obj, reason)

    async def _call(self, op: str, obj: str, method: str, **kwargs: Any) -> Any:
        """``client.<method>(**kwargs)`` within `op_timeout`, failures as StoreError."""
        try:
            async with asyncio.timeout(self.op_timeout):
                s3 = await self.client()
                return await getattr(s3, method)(**kwargs)
        except _FAILURES as exc:
            raise self._fail(op, obj, exc) from exc

    # -- operations --------------------------------------------------------------------

    async def list_paths(self, prefix: str) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        try:
            async with asyncio.timeout(self.op_timeout):
                s3 = await self.client()
            pages = s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{self.prefix}{prefix}").__aiter__()
            while True:
                async with asyncio.timeout(self.op_timeout):  # each page
                    try:
                        page = await pages.__anext__()
                    except StopAsyncIteration:
                        break
                for obj in page.get("Contents", ()):
                    found.append((obj["Key"][len(self.prefix):],
                                  int(obj["LastModified"].timestamp())))
        except _FAILURES as exc:
            raise self._fail("list", prefix or "/", exc) from exc
        return found

    async def get(self, fragment: Fragment, begin: int = 0,
                  end: int | None = None) -> AsyncIterator[bytes]:
        check_range(begin, end)
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(fragment)}
        if end is not None and end == begin:
            # No Range can say "nothing" (S3 ignores an invalid one and sends it all).
            if not await self.exists(fragment):
                raise FragmentNotFound(self.url, "get", fragment.path, "NoSuchKey")
            return
        if begin or end is not None:
            args["Range"] = f"bytes={begin}-{'' if end is None else end - 1}"
        try:
            resp = await self._call("get", fragment.path, "get_object", **args)
        except StoreError as exc:
            if _error_code(exc.__cause__ or exc) == "InvalidRange":
                return  # begins at or after the end of the object: nothing to read
            raise
        body = resp["Body"]
        try:
            while True:
                try:
                    async with asyncio.timeout(self.op_timeout):
                        chunk = await body.read(CHUNK_SIZE)
                except _FAILURES as exc:
                    raise self._fail("get", fragment.path, exc) from exc
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()

    async def put(self, fragment: Fragment, data: PutData) -> None:
        key, obj = self._key(fragment), fragment.path
        payload, source = split_put_data(data)
        extra: dict[str, str] = {"ContentType": "application/octet-stream", **self._put_args}
        if fragment.codec == CompressionCodec.GZIP_OFFLOAD_DECOMPRESSION:
            extra["ContentEncoding"] = "gzip"
        try:
            if payload is not None:
                size = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
            else:
                assert source is not None
                size = await asyncio.to_thread(os.path.getsize, source)
            if size <= self.multipart_threshold:
                if payload is None:
                    assert source is not None
                    payload = await asyncio.to_thread(source.read_bytes)
                body = payload if isinstance(payload, bytes) else bytes(payload)
                await self._call("put", obj, "put_object", Bucket=self.bucket, Key=key,
                                 Body=body, **extra)
            else:
                await self._put_multipart(obj, key, size, payload, source, extra)
        except OSError as exc:  # reading the local file (S3 failures are StoreErrors)
            raise StoreError(self.url, "put", obj,
                             f"cannot read the local file {source}: {exc}") from exc

    async def _put_multipart(self, obj: str, key: str, size: int, payload: Payload | None,
                             source: Path | None, extra: Mapping[str, str]) -> None:
        part_size = max(self.part_size, -(-size // MAX_PARTS))
        created = await self._call("put", obj, "create_multipart_upload", Bucket=self.bucket,
                                   Key=key, **extra)
        upload_id = created["UploadId"]
        try:
            parts = []
            for number, offset in enumerate(range(0, size, part_size), start=1):
                want = min(part_size, size - offset)
                if payload is not None:
                    chunk = bytes(payload[offset:offset + want])
                else:
                    assert source is not None
                    chunk = await asyncio.to_thread(_read_at, source, offset, want)
                    if len(chunk) != want:
                        raise StoreError(self.url, "put", obj, f"the local file {source} "
                                         f"changed size during the upload (was {size})")
                done = await self._call("put", obj, "upload_part", Bucket=self.bucket,
                                        Key=key, UploadId=upload_id, PartNumber=number,
                                        Body=chunk)
                parts.append({"ETag": done["ETag"], "PartNumber": number})
            await self._call("put", obj, "complete_multipart_upload", Bucket=self.bucket,
                             Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            # Abort even when cancelled: in a task of its own, which a second
            # cancellation does not stop.
            abort = asyncio.ensure_future(self._abort(obj, key, upload_id))
            self._background.add(abort)
            abort.add_done_callback(self._background.discard)
            await asyncio.shield(abort)
            raise

    async def _abort(self, obj: str, key: str, upload_id: str) -> None:
        try:
            await self._call("put", obj, "abort_multipart_upload", Bucket=self.bucket,
                             Key=key, UploadId=upload_id)
        except StoreError as exc:
            log.warning("%s: could not abort the multipart upload of %s (%s); a bucket "
                        "lifecycle rule must collect it", self.url, obj, exc)

    async def exists(self, fragment: Fragment) -> bool:
        try:
            await self._call("exists", fragment.path, "head_object", Bucket=self.bucket,
                             Key=self._key(fragment))
        except FragmentNotFound:
            return False
        return True

    async def remove(self, fragment: Fragment) -> None:
        await self._call("remove", fragment.path, "delete_object", Bucket=self.bucket,
                         Key=self._key(fragment))

    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        """A presigned GET URL of the fragment's object, valid for `ttl` (at least a
        second, at most the 7 days SigV4 allows; with temporary credentials, no longer
        than they last)."""
        seconds = int(min(max(ttl, timedelta(seconds=1)), MAX_SIGN_TTL).total_seconds())
        params = {"Bucket": self.bucket, "Key": self._key(fragment)}
        try:
            async with asyncio.timeout(self.op_timeout):
                s3 = await self.client()
            url = await s3.generate_presigned_url("get_object", Params=params,
                                                  ExpiresIn=seconds)
        except _FAILURES as exc:
            raise self._fail("sign", fragment.path, exc) from exc
        return str(url)


def _read_at(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)

