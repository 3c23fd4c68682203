"""The operator's small API client over TLS, as a pod reaches its API server: the CA and
bearer token of its credentials (kopf's `ConnectionInfo`) are used; a server the CA did
not sign is refused; statuses map to what its callers expect."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestServer

from gazette_operator.kube import KubeApi, KubeError, namespace_terminating


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[str, Path, list[Any]]]:
    """An HTTPS server answering a Namespace being deleted; (URL, CA file, requests)."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    seen: list[Any] = []

    async def namespace(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        if request.match_info["name"] == "forbidden":
            return web.json_response({"message": "namespaces is forbidden"}, status=403)
        if request.match_info["name"] == "gone":
            return web.json_response({"message": "not found"}, status=404)
        return web.json_response({"metadata": {"name": request.match_info["name"],
                                               "deletionTimestamp": "2026-01-01T00:00:00Z"}})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{name}", namespace)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=context)
    try:
        yield f"https://127.0.0.1:{server.port}", ca_file, seen
    finally:
        await server.close()


async def test_tls_and_token_from_the_credentials(api: tuple[str, Path, list[Any]]) -> None:
    url, ca_file, seen = api
    info = kopf.ConnectionInfo(server=url, ca_path=str(ca_file), token="secret-token")
    async with KubeApi(info) as client:
        assert await namespace_terminating(client, "doomed")
        assert not await namespace_terminating(client, "gone")
        with pytest.raises(KubeError, match="403 namespaces is forbidden"):
            await namespace_terminating(client, "forbidden")
    assert seen == ["Bearer secret-token"] * 3


async def test_a_server_its_ca_did_not_sign_is_refused(api: tuple[str, Path, list[Any]],
                                                       tmp_path: Path) -> None:
    url, _, seen = api
    other = tmp_path / "other.crt"
    trustme.CA().cert_pem.write_to_path(str(other))
    async with KubeApi(kopf.ConnectionInfo(server=url, ca_path=str(other))) as client:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await client.get("/api/v1/namespaces/doomed")
    assert seen == []
