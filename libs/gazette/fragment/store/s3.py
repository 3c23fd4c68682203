"""``s3://bucket/prefix/`` stores, through aiobotocore.

Query parameters of the store URL: ``endpoint`` (an S3-compatible server such as MinIO),
``region``, ``profile``, ``storage_class``, ``sse``, ``acl``. Credentials come from the
standard AWS chain (environment, profile, instance metadata). With an ``endpoint``,
addressing is path-style (what MinIO and moto expect), else virtual-host style; set
``AWS_S3_ADDRESSING_STYLE`` to choose.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any

from aiobotocore.session import AioSession
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from gazette.fragment.fragment import Fragment
from gazette.fragment.index import from_listing
from gazette.fragment.store.base import CHUNK_SIZE, FragmentNotFound, FragmentStore, StoreError

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
#: What an S3 call raises when it fails (TimeoutError: our own bound, `op_timeout`).
_FAILURES = (BotoCoreError, ClientError, TimeoutError)


class S3Store(FragmentStore):
    def __init__(self, url: str, env: Mapping[str, str] | None = None,
                 connect_timeout: float = 10.0, read_timeout: float = 60.0,
                 max_attempts: int = 3, op_timeout: float = 300.0) -> None:
        self.url = url
        #: Bound on any one call (each chunk, for gets): a frozen S3 endpoint must fail
        #: the operation, so the persister can retry, not hang it.
        self.op_timeout = op_timeout
        parts = urllib.parse.urlsplit(url)
        self.bucket = parts.netloc
        self.prefix = parts.path.lstrip("/")
        query = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
        env = os.environ if env is None else env
        self._endpoint = query.get("endpoint") or None
        self._region = (query.get("region") or env.get("AWS_REGION")
                        or env.get("AWS_DEFAULT_REGION") or "us-east-1")
        self._put_args = {k: v for k, v in (("StorageClass", query.get("storage_class")),
                                            ("ServerSideEncryption", query.get("sse")),
                                            ("ACL", query.get("acl"))) if v}
        style = env.get("AWS_S3_ADDRESSING_STYLE") or ("path" if self._endpoint else "auto")
        self._config = Config(s3={"addressing_style": style}, connect_timeout=connect_timeout,
                              read_timeout=read_timeout,
                              retries={"max_attempts": max_attempts, "mode": "standard"})
        self._session = AioSession(profile=query.get("profile"))
        self._credentials = {
            k: env[e] for k, e in (("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
                                   ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                                   ("aws_session_token", "AWS_SESSION_TOKEN")) if env.get(e)}
        self._client: Any = None
        self._client_cm: Any = None

    async def _s3(self) -> Any:
        """The client, created on first use and kept until `close()`."""
        if self._client is None:
            self._client_cm = self._session.create_client(
                "s3", region_name=self._region, endpoint_url=self._endpoint,
                config=self._config, **self._credentials)
            self._client = await self._client_cm.__aenter__()
        return self._client

    async def close(self) -> None:
        if self._client_cm is not None:
            cm, self._client, self._client_cm = self._client_cm, None, None
            await cm.__aexit__(None, None, None)

    def _key(self, fragment: Fragment) -> str:
        return self.prefix + fragment.path

    def _fail(self, op: str, obj: str, exc: Exception) -> StoreError:
        code = exc.response.get("Error", {}).get("Code", "") if isinstance(
            exc, ClientError) else ""
        cls = FragmentNotFound if code in _NOT_FOUND else StoreError
        reason = str(exc) or f"no answer within {self.op_timeout}s"
        return cls(self.url, op, obj, reason)

    async def list(self, journal: str) -> list[Fragment]:
        try:
            async with asyncio.timeout(self.op_timeout):
                s3 = await self._s3()
                paths = []
                async for page in s3.get_paginator("list_objects_v2").paginate(
                        Bucket=self.bucket, Prefix=f"{self.prefix}{journal}/"):
                    for obj in page.get("Contents", ()):
                        paths.append((obj["Key"][len(self.prefix):],
                                      int(obj["LastModified"].timestamp())))
        except _FAILURES as exc:
            raise self._fail("list", journal, exc) from exc
        return [f for f in from_listing(paths, self.url) if f.journal == journal]

    async def get(self, fragment: Fragment, begin: int = 0,
                  end: int | None = None) -> AsyncIterator[bytes]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(fragment)}
        if begin or end is not None:
            args["Range"] = f"bytes={begin}-{'' if end is None else end - 1}"
        try:
            async with asyncio.timeout(self.op_timeout):
                s3 = await self._s3()
                resp = await s3.get_object(**args)
            async with resp["Body"] as body:
                while True:
                    async with asyncio.timeout(self.op_timeout):
                        chunk = await body.read(CHUNK_SIZE)
                    if not chunk:
                        return
                    yield chunk
        except _FAILURES as exc:
            raise self._fail("get", fragment.path, exc) from exc

    async def put(self, fragment: Fragment, data: bytes) -> None:
        """One PutObject: S3 makes an object visible whole or not at all."""
        try:
            async with asyncio.timeout(self.op_timeout):
                s3 = await self._s3()
                await s3.put_object(Bucket=self.bucket, Key=self._key(fragment), Body=data,
                                    ContentType="application/octet-stream", **self._put_args)
        except _FAILURES as exc:
            raise self._fail("put", fragment.path, exc) from exc

    async def exists(self, fragment: Fragment) -> bool:
        try:
            async with asyncio.timeout(self.op_timeout):
                s3 = await self._s3()
                await s3.head_object(Bucket=self.bucket, Key=self._key(fragment))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in _NOT_FOUND:
                return False
            raise self._fail("exists", fragment.path, exc) from exc
        except (BotoCoreError, TimeoutError) as exc:
            raise self._fail("exists", fragment.path, exc) from exc

    async def remove(self, fragment: Fragment) -> None:
        try:
            async with asyncio.timeout(self.op_timeout):
                s3 = await self._s3()
                await s3.delete_object(Bucket=self.bucket, Key=self._key(fragment))
        except _FAILURES as exc:
            raise self._fail("remove", fragment.path, exc) from exc

    async def sign(self, fragment: Fragment, ttl: timedelta) -> str:
        """A presigned GET URL, valid for `ttl`."""
        try:
            s3 = await self._s3()
            return str(await s3.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(fragment)},
                ExpiresIn=max(1, int(ttl.total_seconds()))))
        except _FAILURES as exc:
            raise self._fail("sign", fragment.path, exc) from exc
