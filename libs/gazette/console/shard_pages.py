"""The shards pages (a consumer application's shards with each replica's status, lag and
recovery progress; one shard with its checkpoint and recovery-log hints) and the members
page (brokers and consumer members from etcd, with their zones and assignments). The
shards' lag and status are gazctl's (`gazette.gazctl.shards`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gazette.client import BrokerError, ListedShard, ShardClient, ShardError
from gazette.console.backend import Backend
from gazette.console.cluster import Group, endpoint_of, read_groups
from gazette.console.views import (
    BadInput,
    NotFound,
    RouteView,
    human_bytes,
    labels_of,
    param,
    pretty,
    replicas_of,
    selector_param,
    shard_param,
)
from gazette.gazctl.shards import NOT_RUNNING, lags, status_text
from gazette.keyspace import EtcdError
from gazette.labels import LabelSet, Selector
from gazette.protocol.trees import specs_to_yaml

Page = tuple[str, dict[str, Any]]


async def groups(backend: Backend) -> list[Group]:
    """The brokers and consumer applications in etcd ([] without --etcd.address)."""
    if backend.etcd is None:
        return []
    config = backend.config
    return await read_groups(backend.etcd, config.etcd_prefix, config.consumer_etcd_prefix)


async def source(backend: Backend, app: str
                 ) -> tuple[ShardClient, str, str, list[str], str]:
    """The shard client of `app`'s members (from etcd), else of --consumer.address
    (else of the first application in etcd); the application ("": the address's);
    what it is; the applications etcd knows (for the page's choice); and why those are
    unknown, if they are."""
    apps: list[str] = []
    found: dict[str, Group] = {}
    problem = ""
    if backend.etcd is not None:
        try:
            found = {g.name: g for g in (await groups(backend))[1:]}
            apps = sorted(found)
        except EtcdError as err:
            if app:
                raise
            problem = f"the applications in etcd are unknown: {err}"
    if not app and apps and backend.resolved.consumer.source == "the default":
        app = apps[0]  # no --consumer.address given: the first application in etcd
    if not app:
        return (backend.shards(), "", f"the consumer member at {backend.consumer}", apps,
                problem)
    if backend.etcd is None:
        raise BadInput(f"the console has no --etcd.address, so it cannot find the members "
                       f"of {app!r}", field="app")
    if app not in found:
        raise NotFound(f"no consumer application {app!r} has members or shards in etcd "
                       f"(under {backend.config.consumer_etcd_prefix})", field="app")
    endpoint = endpoint_of(found[app])
    if not endpoint:
        raise NotFound(f"application {app!r} has shards but no running member to ask",
                       field="app")
    return (backend.shards(endpoint), app, f"application {app} (member {endpoint})", apps,
            problem)


async def lag_of(backend: Backend, client: ShardClient, shards: list[ListedShard]
                 ) -> tuple[dict[str, int | None], str]:
    """Each shard's lag in bytes (gazctl's), or why it is unknown."""
    try:
        return await lags(backend.gazctl(), client, shards), ""
    except (ShardError, BrokerError) as err:
        return {}, f"lag is unknown: {err}"


async def checkpoints(client: ShardClient, shards: list[ListedShard]
                      ) -> dict[str, dict[str, int]]:
    """Each running shard's checkpoint: the offsets of its sources it has read through
    (a shard without a running primary has none to show)."""
    async def one(shard: ListedShard) -> dict[str, int] | None:
        try:
            return (await client.stat(shard.spec.id)).read_through
        except ShardError as err:
            if err.status in NOT_RUNNING:
                return None
            raise

    found = await asyncio.gather(*(one(s) for s in shards))
    return {s.spec.id: f for s, f in zip(shards, found, strict=True) if f is not None}


def shard_row(shard: ListedShard, lag: dict[str, int | None],
              read_through: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    value = lag.get(shard.spec.id)
    through = (read_through or {}).get(shard.spec.id, {})
    return {"id": shard.spec.id, "status": status_text(shard),
            "replicas": replicas_of(shard), "route": RouteView.of(shard.route),
            "sources": [s.journal for s in shard.spec.sources],
            "read_through": [through.get(s.journal) for s in shard.spec.sources],
            "lag": None if value is None else human_bytes(value),
            "disabled": shard.spec.disable}


async def shards(backend: Backend, query: Mapping[str, str]) -> Page:
    app = param(query, "app")
    selector = selector_param(query)
    client, app, what, apps, problem = await source(backend, app)
    listed = await client.list(selector)
    lag, lag_problem = await lag_of(backend, client, listed)
    read_through: dict[str, dict[str, int]] = {}
    if not lag_problem:  # (else the same refusal again)
        read_through = await checkpoints(client, listed)
    return "shards.html", {"app": app, "apps": apps, "what": what,
                           "selector": param(query, "selector"),
                           "rows": [shard_row(s, lag, read_through) for s in listed],
                           "notes": [n for n in (problem, lag_problem) if n]}


async def shard(backend: Backend, query: Mapping[str, str]) -> Page:
    shard_id = shard_param(query, "id")
    app = param(query, "app")
    client, app, what, _, _ = await source(backend, app)
    listed = [s for s in await client.list(Selector(LabelSet([("id", shard_id)])))
              if s.spec.id == shard_id]
    if not listed:
        raise NotFound(f"{what} has no shard {shard_id!r}", field="id")
    found = listed[0]
    notes: list[str] = []
    checkpoint: dict[str, Any] | None = None
    try:
        stat = await client.stat(shard_id)
        checkpoint = {"read_through": stat.read_through, "publish_at": stat.publish_at}
    except ShardError as err:
        if err.status not in NOT_RUNNING:
            raise
        notes.append(f"no checkpoint shown: {err} (the shard has no running primary)")
    hints = await client.get_hints(shard_id)
    lag, lag_problem = await lag_of(backend, client, [found])
    if lag_problem:
        notes.append(lag_problem)
    spec = found.spec
    return "shard.html", {
        "id": shard_id, "app": app, "what": what, "row": shard_row(found, lag),
        "labels": labels_of(spec.labels), "checkpoint": checkpoint,
        "spec_yaml": specs_to_yaml([(spec, found.mod_revision)]),
        "hints": None if hints.empty else pretty(hints.to_dict()),
        "recovery_log": spec.recovery_log or "", "notes": notes}


async def members(backend: Backend, query: Mapping[str, str]) -> Page:
    found = await groups(backend)
    return "members.html", {"groups": found, "etcd": backend.config.etcd_address,
                            "broker_root": backend.config.etcd_prefix,
                            "consumer_root": backend.config.consumer_etcd_prefix}
