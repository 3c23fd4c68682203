"""The journals pages: the list (by label selector, with write heads and routes), one
journal (spec, labels, route, fragments) and its message browser. Each returns its
template's name and what the template shows."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Mapping
from typing import Any

from gazette.client import BrokerError, FragmentInfo, ListedJournal
from gazette.client.connection import MAX_INT64
from gazette.console.backend import Backend
from gazette.console.browse import Cursor, read_page
from gazette.console.config import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from gazette.console.views import (
    BadInput,
    RouteView,
    human_bytes,
    int_param,
    journal_param,
    labels_of,
    offset_param,
    param,
    selector_param,
    time_param,
    when,
)
from gazette.protocol.trees import specs_to_yaml

Page = tuple[str, dict[str, Any]]

#: Journals listed on one page (narrow the selector for the others), and fragments.
MAX_LISTED, MAX_FRAGMENTS = 500, 1000
#: Write heads asked of the broker at once.
HEADS_AT_ONCE = 16


def content_type_of(journal: ListedJournal) -> str:
    values = journal.spec.labels.values("content-type")
    return values[0] if values else ""


async def write_heads(backend: Backend, names: list[str]) -> dict[str, int | str]:
    """Each journal's write head, or why it has none now (a suspended journal, a route
    changing): a journal's failure is its cell's, not the page's."""
    gate = asyncio.Semaphore(HEADS_AT_ONCE)

    async def one(name: str) -> int | str:
        async with gate:
            try:
                return await backend.client.write_head(name)
            except BrokerError as err:
                return str(err.status)

    return dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))


async def journals(backend: Backend, query: Mapping[str, str]) -> Page:
    selector = selector_param(query)
    listing = await backend.client.list(selector)
    shown = listing.journals[:MAX_LISTED]
    heads = await write_heads(backend, [j.spec.name for j in shown])
    rows = []
    for j in shown:
        head = heads[j.spec.name]
        rows.append({"name": j.spec.name, "labels": labels_of(j.spec.labels),
                     "replication": j.spec.replication, "route": RouteView.of(j.route),
                     "head": head if isinstance(head, int) else None,
                     "head_size": human_bytes(head) if isinstance(head, int) else head})
    return "journals.html", {"selector": param(query, "selector"), "rows": rows,
                             "total": len(listing.journals), "revision": listing.revision}


def fragment_row(item: FragmentInfo) -> dict[str, Any]:
    f = item.fragment
    return {"begin": f.begin, "end": f.end, "size": human_bytes(f.size),
            "codec": f.codec.value, "store": f.backing_store or "", "path": f.path,
            "persisted": when(f.mod_time) if f.mod_time else "",
            "error": item.persist_error}


async def journal(backend: Backend, query: Mapping[str, str]) -> Page:
    name = journal_param(query, "name")
    found = await backend.journal(name)
    head, fragments = await asyncio.gather(backend.client.write_head(name),
                                           backend.client.list_fragments(name))
    spec = found.spec
    return "journal.html", {
        "name": name, "spec_yaml": specs_to_yaml([(spec, found.mod_revision)]),
        "labels": labels_of(spec.labels), "replication": spec.replication,
        "route": RouteView.of(found.route), "head": head, "head_size": human_bytes(head),
        "content_type": content_type_of(found), "stores": list(spec.fragment.stores),
        "fragments": [fragment_row(f) for f in fragments[-MAX_FRAGMENTS:]],
        "fragment_count": len(fragments),
        "persisted_bytes": human_bytes(sum(f.fragment.size for f in fragments
                                           if f.fragment.mod_time)),
        "revision": found.mod_revision}


async def offset_since(backend: Backend, name: str, since: int, head: int
                       ) -> tuple[int, str]:
    """Where messages since `since` (Unix seconds) begin: the first fragment persisted
    at or after it, else the first not persisted yet (newer than any persisted), else
    the write head; and how it was found."""
    persisted = await backend.client.list_fragments(name, begin_mod_time=since)
    if persisted:
        begin = min(i.fragment.begin for i in persisted)
        return begin, f"the first fragment persisted at or after {when(since)}"
    pending = [i.fragment.begin for i in await backend.client.list_fragments(name)
               if not i.fragment.mod_time]
    if pending:
        return min(pending), (f"no fragment was persisted since {when(since)}: from the "
                              "first fragment not persisted yet")
    return head, f"nothing was written since {when(since)}: at the write head"


def link(path: str, **values: object) -> str:
    """`path` with `values` as its query (those that are None left out)."""
    return f"{path}?" + urllib.parse.urlencode(
        {k: v for k, v in values.items() if v is not None})


async def messages(backend: Backend, query: Mapping[str, str]) -> Page:
    name = journal_param(query, "journal")
    limit = int_param(query, "limit", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE,
                      "a number of messages", above=" messages a page (page on instead)")
    mode = param(query, "mode") or "committed"
    if mode not in ("committed", "uncommitted"):
        raise BadInput(f"{mode!r} is no mode: committed or uncommitted", field="mode")
    since = time_param(query)
    if since is not None and param(query, "offset"):
        raise BadInput("give an offset or a time (since), not both", field="since")
    offset = offset_param(query)
    after = int_param(query, "after", 0, 0, MAX_INT64, "a byte offset")
    skip = int_param(query, "skip", 0, 0, MAX_INT64, "a number of messages")
    found = await backend.journal(name)
    head = await backend.client.write_head(name)
    how = ""
    if since is not None:
        offset, how = await offset_since(backend, name, since, head)
    elif offset == -1:
        offset, how = head, "the write head"
    elif offset > head:
        raise BadInput(f"offset {offset} is past the write head of {name} ({head}): "
                       "nothing is there yet (-1 starts at the head)", field="offset")
    page = await read_page(backend.client, name, content_type_of(found), head,
                           Cursor(offset, after, skip), limit, mode == "committed")
    shown_mode = "committed" if page.committed else "uncommitted"
    nxt = page.next
    next_link = None if nxt is None else link(
        "/messages", journal=name, offset=nxt.offset, after=nxt.after or None,
        skip=nxt.skip or None, limit=limit, mode=shown_mode)
    return "messages.html", {
        "name": name, "page": page, "how": how, "limit": limit, "mode": shown_mode,
        "offset": offset, "next_link": next_link, "since": param(query, "since"),
        "head_size": human_bytes(head),
        "first_link": link("/messages", journal=name, offset=0, limit=limit,
                           mode=shown_mode),
        "tail_link": link("/messages", journal=name, offset=-1, limit=limit,
                          mode=shown_mode),
        "other_mode_link": link("/messages", journal=name, offset=offset, limit=limit,
                                mode="uncommitted" if page.committed else "committed")}
