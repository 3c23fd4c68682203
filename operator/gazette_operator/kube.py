"""A small Kubernetes API client for what the operator does outside kopf's handlers:
the uninstall hook (delete the release's resources, wait, let go of finalizers), and
letting go of finalizers in a namespace being deleted (its etcd may be gone with it).

It speaks JSON over aiohttp with the credentials kopf's login functions find (the pod's
service account, else a kubeconfig), turned into headers and TLS settings by kopf's own
`kopf.ConnectionInfo` methods.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import aiohttp
import kopf

from gazette_operator.crds import GROUP, VERSION

PLURALS = ("journalspecs", "shardspecs")


class KubeError(Exception):
    """The API answered an unexpected status."""


def _ssl(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    """kopf's own TLS settings of `info` (its CA, client certificate, ``insecure``)."""
    return info.as_ssl_context() if info.server.startswith("https://") else False


class KubeApi:
    """JSON requests to the API server of `info`; ``async with`` closes its session."""

    def __init__(self, info: kopf.ConnectionInfo) -> None:
        self.server = info.server.rstrip("/")
        self._ssl = _ssl(info)
        self._headers = info.as_http_headers()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> tuple[int, Any]:
        """(status, decoded JSON body or None)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=aiohttp.ClientTimeout(total=30))
        headers = {"Content-Type": content_type} if json is not None else {}
        async with self._session.request(method, self.server + path, json=json,
                                         params=params, headers=headers,
                                         ssl=self._ssl) as r:
            body = await r.json(content_type=None) if r.content_length != 0 else None
            return r.status, body

    async def get(self, path: str) -> dict[str, Any] | None:
        status, body = await self.request("GET", path)
        if status == 404:
            return None
        _check(status, body, f"GET {path}")
        return dict(body)

    async def items(self, path: str, selector: str = "") -> list[dict[str, Any]]:
        status, body = await self.request(
            "GET", path, params={"labelSelector": selector} if selector else None)
        _check(status, body, f"GET {path}")
        return [dict(item) for item in body.get("items") or []]

    async def delete(self, path: str) -> bool:
        """Whether the object existed."""
        status, body = await self.request("DELETE", path)
        if status == 404:
            return False
        _check(status, body, f"DELETE {path}")
        return True

    async def json_patch(self, path: str, ops: list[dict[str, Any]]) -> bool:
        """Apply JSON patch `ops`; False if the object is gone or a ``test`` failed."""
        status, body = await self.request("PATCH", path, json=ops,
                                          content_type="application/json-patch+json")
        if status in (404, 409, 422):
            return False
        _check(status, body, f"PATCH {path}")
        return True


def _check(status: int, body: Any, what: str) -> None:
    if status >= 300:
        message = body.get("message") if isinstance(body, dict) else body
        raise KubeError(f"{what}: {status} {message or ''}".rstrip())


def resources_path(plural: str, namespace: str = "", name: str = "") -> str:
    """The API path of our resources: in `namespace` (every namespace if empty)."""
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{GROUP}/{VERSION}{where}/{plural}" + (f"/{name}" if name else "")


def path_of(obj: Mapping[str, Any], plural: str) -> str:
    meta = obj["metadata"]
    return resources_path(plural, meta["namespace"], meta["name"])


async def namespace_terminating(api: KubeApi, namespace: str) -> bool:
    """Whether `namespace` is being deleted (one that does not exist is not: nothing of
    it is left to hold)."""
    found = await api.get(f"/api/v1/namespaces/{namespace}")
    return found is not None and (bool(found.get("metadata", {}).get("deletionTimestamp"))
                                  or found.get("status", {}).get("phase") == "Terminating")


async def drop_finalizer(api: KubeApi, obj: Mapping[str, Any], plural: str,
                         finalizer: str) -> bool:
    """Remove `finalizer` from `obj` (only if it is still where it was read); whether it
    was removed."""
    finalizers = list(obj.get("metadata", {}).get("finalizers") or [])
    if finalizer not in finalizers:
        return False
    at = f"/metadata/finalizers/{finalizers.index(finalizer)}"
    return await api.json_patch(path_of(obj, plural), [
        {"op": "test", "path": at, "value": finalizer}, {"op": "remove", "path": at}])


async def holding(api: KubeApi, namespaces: list[str], finalizer: str
                  ) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of every resource in `namespaces` (every namespace if empty)
    that carries `finalizer`."""
    found = []
    for namespace in namespaces or [""]:
        for plural in PLURALS:
            for obj in await api.items(resources_path(plural, namespace)):
                if finalizer in (obj.get("metadata", {}).get("finalizers") or []):
                    found.append((plural, obj))
    return found


async def let_go_in_terminating(api: KubeApi, namespaces: list[str], finalizer: str
                                ) -> list[str]:
    """Drop `finalizer` from our resources in those of `namespaces` being deleted: with
    the namespace goes the operator (and maybe its etcd), and a finalizer nobody removes
    would keep the namespace Terminating for ever. The resources dropped (ns/name)."""
    dropped = []
    verdicts: dict[str, bool] = {}
    for plural, obj in await holding(api, namespaces, finalizer):
        namespace = obj["metadata"]["namespace"]
        if namespace not in verdicts:
            verdicts[namespace] = await namespace_terminating(api, namespace)
        if verdicts[namespace] and await drop_finalizer(api, obj, plural, finalizer):
            dropped.append(f"{namespace}/{obj['metadata']['name']}")
    return dropped
