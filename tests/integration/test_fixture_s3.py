"""The S3 fixtures give a real, isolated, path-style S3 endpoint (moto server)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from tests.fixtures.procs import port_open
from tests.fixtures.s3 import S3Bucket, S3Server

pytestmark = pytest.mark.integration

_seen_buckets: list[str] = []


def _assert_fresh_bucket(bucket: S3Bucket) -> None:
    """Each test gets an empty bucket nobody (in this process) had before."""
    assert bucket.name not in _seen_buckets
    _seen_buckets.append(bucket.name)
    client = bucket.server.client()
    try:
        assert client.list_objects_v2(Bucket=bucket.name).get("KeyCount") == 0
        client.put_object(Bucket=bucket.name, Key="marker", Body=b"left behind on purpose")
    finally:
        client.close()


def test_bucket_is_fresh_a(s3_bucket: S3Bucket) -> None:
    _assert_fresh_bucket(s3_bucket)


def test_bucket_is_fresh_b(s3_bucket: S3Bucket) -> None:
    _assert_fresh_bucket(s3_bucket)


def test_bucket_url(s3_bucket: S3Bucket) -> None:
    assert s3_bucket.name.startswith("test-")
    assert s3_bucket.url == f"s3://{s3_bucket.name}/"


def test_put_list_get_path_style(s3_bucket: S3Bucket) -> None:
    server = s3_bucket.server
    client = server.client()
    urls: list[str] = []

    def record(request: Any, **_: Any) -> None:
        urls.append(request.url)

    client.meta.events.register("before-send.s3.PutObject", record)
    try:
        client.put_object(Bucket=s3_bucket.name, Key="a/b/fragment", Body=b"hello journal")
        listed = client.list_objects_v2(Bucket=s3_bucket.name, Prefix="a/")
        assert [o["Key"] for o in listed["Contents"]] == ["a/b/fragment"]
        got = client.get_object(Bucket=s3_bucket.name, Key="a/b/fragment")
        assert got["Body"].read() == b"hello journal"
    finally:
        client.close()
    # Path style: the bucket is in the path, not in the host name.
    assert urls == [f"{server.endpoint_url}/{s3_bucket.name}/a/b/fragment"]


async def test_aiobotocore_round_trip(s3_bucket: S3Bucket) -> None:
    server = s3_bucket.server
    async with server.aio_session().create_client("s3", **server.client_kwargs()) as client:
        await client.put_object(Bucket=s3_bucket.name, Key="async/obj", Body=b"\x00\x01async")
        listed = await client.list_objects_v2(Bucket=s3_bucket.name)
        assert [o["Key"] for o in listed["Contents"]] == ["async/obj"]
        got = await client.get_object(Bucket=s3_bucket.name, Key="async/obj")
        async with got["Body"] as body:
            assert await body.read() == b"\x00\x01async"


def test_bucket_delete_removes_objects_and_bucket(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    try:
        client.put_object(Bucket=bucket.name, Key="k", Body=b"v")
        up = client.create_multipart_upload(Bucket=bucket.name, Key="pending")
        assert up["UploadId"]
        bucket.delete()
        with pytest.raises(ClientError) as err:
            client.head_bucket(Bucket=bucket.name)
        assert err.value.response["Error"]["Code"] == "404"
    finally:
        client.close()


def test_env_for_subprocess(s3_bucket: S3Bucket) -> None:
    """A child with only `env()` reaches the server and ignores the machine's AWS setup."""
    base = dict(os.environ, AWS_PROFILE="does-not-exist", AWS_ACCESS_KEY_ID="AKIAREAL")
    env = s3_bucket.server.env(base)
    assert env["AWS_ACCESS_KEY_ID"] == "testing"
    assert "AWS_PROFILE" not in env
    script = (
        "import os, boto3\n"
        "c = boto3.client('s3')\n"
        "assert c.meta.config.s3['addressing_style'] == 'path', c.meta.config.s3\n"
        "c.put_object(Bucket=os.environ['BUCKET'], Key='from-child', Body=b'x')\n"
    )
    subprocess.run(
        [sys.executable, "-c", script], env={**env, "BUCKET": s3_bucket.name},
        check=True, timeout=60,
    )
    client = s3_bucket.server.client()
    try:
        assert client.get_object(Bucket=s3_bucket.name, Key="from-child")["Body"].read() == b"x"
    finally:
        client.close()


def test_restartable_stop_start_keeps_data(s3_server_restartable: S3Server) -> None:
    server = s3_server_restartable
    bucket = server.new_bucket()
    client = server.client(Config(retries={"total_max_attempts": 1}, connect_timeout=1))
    try:
        client.put_object(
            Bucket=bucket.name, Key="frag", Body=b"durable", ContentType="application/x-gz",
            Metadata={"k": "v"},
        )
        server.stop()
        assert not port_open(server.port)
        with pytest.raises(EndpointConnectionError):
            client.list_buckets()
        server.start()
        got = client.get_object(Bucket=bucket.name, Key="frag")
        assert got["Body"].read() == b"durable"
        assert got["ContentType"] == "application/x-gz"
        assert got["Metadata"] == {"k": "v"}
    finally:
        client.close()


def test_restartable_kill_loses_data(s3_server_restartable: S3Server) -> None:
    server = s3_server_restartable
    bucket = server.new_bucket()
    server.kill()
    assert not server.running()
    server.start()
    client = server.client()
    try:
        assert bucket.name not in [b["Name"] for b in client.list_buckets()["Buckets"]]
    finally:
        client.close()


def test_restartable_pause_hangs_requests(s3_server_restartable: S3Server) -> None:
    server = s3_server_restartable
    bucket = server.new_bucket()
    client = server.client(
        Config(retries={"total_max_attempts": 1}, connect_timeout=0.5, read_timeout=0.5)
    )
    try:
        server.pause()
        with pytest.raises((ReadTimeoutError, ConnectTimeoutError)):
            client.head_bucket(Bucket=bucket.name)
        server.resume()
        client.head_bucket(Bucket=bucket.name)
    finally:
        client.close()
