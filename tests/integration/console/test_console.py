"""The web console in a real browser (Debian's Chromium through Playwright) against a
live cluster with authorization on (`conftest.cluster`): every page shows the cluster's
state as its clients see it; the message browser pages through 10,000 messages, read
committed and not, each once and in order; an events group's dead letter is replayed
from the page with a token that allows it, and not offered with a read-only one; without
a token the brokers' refusal is the page; hostile input is a clear error page and the
console keeps serving. With GAZETTE_CONSOLE_SCREENSHOTS=1 it writes
docs/images/console-<page>.png."""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import aiohttp
import pytest

from gazette.console import Console
from gazette.labels import Selector
from gazette.message import JsonMessage, framing_for
from gazette.message.uuid import Clock, Flags, build, new_producer_id, to_str
from tests.fixtures.consumer import publish
from tests.fixtures.polling import eventually
from tests.fixtures.procs import free_port
from tests.integration.console.conftest import (
    APP,
    GROUP,
    READER,
    Cluster,
    screenshot,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

NDJSON = framing_for("application/x-ndjson")


async def text_of(page: Any, selector: str) -> str:
    return str(await page.inner_text(selector))


async def error_page(page: Any, url: str, status: int) -> str:
    """The error page at `url`: its status is `status`; its reason."""
    response = await page.goto(url)
    assert response.status == status, (url, await text_of(page, "main"))
    return await text_of(page, "#error")


# -- pages show the live cluster --------------------------------------------------------


async def test_journals_page_shows_labels_write_heads_and_routes(
        cluster: Cluster, page: Any) -> None:
    await cluster.client.append("console/orders", b'{"order": 1}\n{"order": 2}\n')
    listing = await cluster.client.list("prefix=console/")
    await page.goto(cluster.url("writer", "/journals?selector=prefix%3Dconsole%2F"))
    rows = await page.eval_on_selector_all(
        "#journals tbody tr", "rows => rows.map(r => Array.from(r.cells, c => "
        "c.innerText.trim()))")
    shown = {row[0]: row for row in rows}
    assert sorted(shown) == sorted(j.spec.name for j in listing.journals)
    for journal in listing.journals:
        row = shown[journal.spec.name]
        assert "console.example/team=blue" in row[1]
        assert row[2] == str(journal.spec.replication)
        head = await cluster.client.write_head(journal.spec.name)
        cell = page.locator("#journals tbody tr", has_text=journal.spec.name).locator(
            "td.num").nth(1)
        assert await cell.get_attribute("title") == f"{head} bytes"
        primary = journal.route.members[journal.route.primary]
        assert row[4] == f"{primary.suffix} ({primary.zone})"
        replicas = [m for i, m in enumerate(journal.route.members)
                    if i != journal.route.primary]
        assert row[5] == (", ".join(f"{m.suffix} ({m.zone})" for m in replicas) or "—")


async def persisted_orders(cluster: Cluster, journal: str, n: int) -> None:
    """`n` appends to `journal`, each rolled into a fragment of its own, and every
    closed fragment persisted (as the broker lists them)."""
    [primary] = [b for b in cluster.brokers if (r := b.broker.replicas.get(journal))
                 is not None and r.is_primary]
    for i in range(n):
        await cluster.client.append(journal, json.dumps({"order": 10 + i}).encode() + b"\n")
        await primary.broker.replicas[journal].roll()
    head = await cluster.client.write_head(journal)
    await primary.broker.persister.wait_idle()

    async def listed() -> bool:
        for broker in cluster.brokers:  # (the index learns of uploads at a refresh)
            if (replica := broker.broker.replicas.get(journal)) is not None:
                await replica.refresh()
        fragments = await cluster.client.list_fragments(journal)
        return all(f.fragment.mod_time for f in fragments if f.fragment.end <= head)

    await eventually(listed, f"the fragments of {journal} are listed as persisted", 20)


async def test_journal_page_shows_spec_and_fragments(cluster: Cluster, page: Any) -> None:
    journal = "console/orders"
    await persisted_orders(cluster, journal, 3)
    fragments = await cluster.client.list_fragments(journal)
    head = await cluster.client.write_head(journal)
    await page.goto(cluster.url("writer", f"/journal?name={journal}"))
    assert (await text_of(page, "#head")).startswith(f"{head} ")
    rows = await page.eval_on_selector_all(
        "#fragments tbody tr", "rows => rows.map(r => Array.from(r.cells, c => "
        "c.innerText.trim()))")
    assert [(int(r[0]), int(r[1])) for r in rows] == \
        [(f.fragment.begin, f.fragment.end) for f in fragments]
    for row, info in zip(rows, fragments, strict=True):
        assert row[3] == info.fragment.codec.value
        if info.fragment.mod_time:
            assert row[4] == "file:///" and row[5] == info.fragment.path
            assert "UTC" in row[6]
        else:
            assert row[6].startswith("not yet")
    assert "name: console/orders" in await text_of(page, "pre.spec")
    await screenshot(page, "journal")


async def test_shards_page_shows_primaries_standbys_and_lag(
        cluster: Cluster, page: Any) -> None:
    shards = cluster.consoles["writer"].backend.shards()
    await publish(cluster.client, 40)  # ten messages to each shard's source
    listed = await shards.list()
    heads = {s.spec.id: await cluster.client.write_head(s.spec.sources[0].journal)
             for s in listed}

    async def caught_up() -> bool:
        for shard in listed:
            stat = await shards.stat(shard.spec.id)
            if stat.read_through.get(shard.spec.sources[0].journal) != heads[shard.spec.id]:
                return False
        return True

    await eventually(caught_up, "every shard read its source through", 20)
    await page.goto(cluster.url("writer", "/shards"))
    rows = await page.eval_on_selector_all(
        "#shards tbody tr", "rows => rows.map(r => Array.from(r.cells, c => "
        "c.innerText.trim()))")
    assert [r[0] for r in rows] == [s.spec.id for s in listed]
    for row, shard in zip(rows, listed, strict=True):
        assert row[1] == "primary"
        primary = shard.route.members[shard.route.primary]
        assert f"primary {primary.suffix} ({primary.zone}): primary" in row[2]
        assert "standby " in row[2] and ": standby" in row[2]
        assert row[3].endswith("B")  # a lag, in bytes
        assert row[4] == f"{shard.spec.sources[0].journal} @ {heads[shard.spec.id]}"
    await screenshot(page, "shards")
    async with page.expect_navigation():
        await page.click(f"text={listed[0].spec.id}")
    assert await text_of(page, "h1") == f"Shard {listed[0].spec.id}"
    assert listed[0].spec.sources[0].journal in await text_of(page, "#checkpoint")
    await screenshot(page, "shard")


async def test_members_page_shows_brokers_consumers_zones_and_assignments(
        cluster: Cluster, page: Any) -> None:
    await page.goto(cluster.url("writer", "/members"))
    brokers = await text_of(page, "#group-brokers")
    assert "2 members in 2 zones (zone-a, zone-b)" in brokers
    for broker in cluster.brokers:
        assert broker.id.suffix in brokers and broker.endpoint in brokers
    assert "console/orders" in brokers
    consumers = await text_of(page, f"#group-{APP}")
    for member in cluster.members:
        assert member.id.suffix in consumers and member.endpoint in consumers
    for shard in ("shard-0", "shard-3"):
        assert consumers.count(shard) == 2  # a primary and a standby
    assert await page.locator(f"#group-events\\.{GROUP}").count() == 1
    await screenshot(page, "members")


async def test_a_dead_letter_is_replayed_from_the_page(cluster: Cluster, page: Any) -> None:
    await page.goto(cluster.url("writer", "/events"))
    assert "orders" in await text_of(page, "#topics")
    assert "events/orders/dead/billing" in await text_of(page, "#groups")
    await screenshot(page, "events")
    async with page.expect_navigation():
        await page.click("a.dead-letters")
    rows = await page.eval_on_selector_all(
        "#dead-letters tbody tr", "rows => rows.map(r => Array.from(r.cells, c => "
        "c.innerText.trim()))")
    [row] = rows
    assert row[2:5] == ["ship", "1", "RuntimeError: warehouse <b>closed</b>"]
    assert '"id": 3' in row[5]
    await screenshot(page, "dead-letters")
    async with page.expect_navigation():
        await page.click("#replay-all")
    output = await text_of(page, "#output")
    assert "replayed 1 of 1 dead letter(s) of events/orders/dead/billing" in output
    await eventually(lambda: (3, 0) in cluster.seen, "the replayed event handled", 30)


async def test_a_read_only_token_is_not_offered_replay(cluster: Cluster, page: Any
                                                       ) -> None:
    url = "/events/dead-letters?topic=orders&group=billing&prefix=events%2F"
    await page.goto(cluster.url("reader", url))
    assert await page.locator("#dead-letters tbody tr").count() >= 1
    assert await page.locator("#replay-all").count() == 0
    assert await page.locator("button.replay-one").count() == 0
    assert "Read-only" in await text_of(page, "main")
    assert "read-only" in await text_of(page, "nav")
    # Posting the form anyway (with this console's own form token) is refused.
    csrf = cluster.consoles["reader"].csrf
    async with aiohttp.ClientSession() as http, http.post(
            cluster.url("reader", "/events/replay"),
            data={"csrf": csrf, "topic": "orders", "group": GROUP, "prefix": "events/"},
            headers={"Origin": cluster.url("reader", "")}) as r:
        assert r.status == 403
        assert "does not allow appending to events/orders/retry/billing" in await r.text()


async def test_without_a_token_pages_show_the_refusal(cluster: Cluster, page: Any) -> None:
    reason = await error_page(page, cluster.url("none", "/journals"), 401)
    assert "Refused by the broker" in reason and "UNAUTHENTICATED" in reason
    assert "the console holds no token" in reason
    reason = await error_page(page, cluster.url("none", "/shards"), 401)
    assert "Refused by the consumer member" in reason
    await page.goto(cluster.url("none", "/members"))  # etcd's, not the brokers'
    assert cluster.brokers[0].id.suffix in await text_of(page, "#group-brokers")


# -- the message browser ----------------------------------------------------------------


def lines(producer: int, clock: Clock, numbers: range, flags: Flags) -> bytes:
    """Messages {"n": i} of `producer`, with UUIDs of `flags`."""
    return NDJSON.encode([JsonMessage(uuid=to_str(build(producer, clock.tick(), flags)),
                                      n=n) for n in numbers])


async def append_10000(cluster: Cluster) -> tuple[list[int], list[int]]:
    """10,000 messages in five appends, one producer's 500 of them in a transaction
    open across 3,000 of another's: their offset order and their commit order."""
    a, b, clock = new_producer_id(), new_producer_id(), Clock()
    clock.update()
    journal = "console/many"
    await cluster.client.append(journal, lines(a, clock, range(0, 2500), Flags.OUTSIDE_TXN))
    await cluster.client.append(journal, lines(b, clock, range(2500, 3000),
                                               Flags.CONTINUE_TXN))
    await cluster.client.append(journal, lines(a, clock, range(3000, 6000),
                                               Flags.OUTSIDE_TXN))
    await cluster.client.append(journal, NDJSON.encode([JsonMessage(
        uuid=to_str(build(b, clock.tick(), Flags.ACK_TXN)))]))
    await cluster.client.append(journal, lines(a, clock, range(6000, 10000),
                                               Flags.OUTSIDE_TXN))
    return (list(range(10000)),
            [*range(2500), *range(3000, 6000), *range(2500, 3000), *range(6000, 10000)])


async def page_through(page: Any, url: str) -> tuple[list[int], int]:
    """The n of every message from `url` on, following "next" links in the browser
    until the write head; and how many pages that took."""
    await page.goto(url)
    seen: list[int] = []
    pages = 1
    while True:
        texts = await page.eval_on_selector_all("#messages li.message pre",
                                                "els => els.map(e => e.textContent)")
        seen += [m["n"] for m in map(json.loads, texts) if "n" in m]
        if await page.locator("#at-head").count():
            return seen, pages
        async with page.expect_navigation():
            await page.click("#next")
        pages += 1


async def test_the_browser_pages_through_10000_messages(cluster: Cluster, page: Any
                                                        ) -> None:
    offset_order, commit_order = await append_10000(cluster)
    started = time.monotonic()
    base = cluster.url("writer", "/messages?journal=console%2Fmany&limit=1000")
    seen, pages = await page_through(page, base + "&mode=uncommitted")
    assert seen == offset_order and pages == 11  # (the ACK is one more frame)
    seen, pages = await page_through(page, base + "&mode=committed")
    assert seen == commit_order
    print(f"paged 2 x 10,000 messages in {time.monotonic() - started:.1f} s")
    await page.goto(cluster.url("writer", "/journals?selector=prefix%3Dconsole%2F"))
    await screenshot(page, "journals")
    await page.goto(cluster.url("writer", "/messages?journal=console%2Fmany&offset=0&"
                                "limit=20&mode=uncommitted"))
    meta = await text_of(page, "#messages li.message .meta")
    assert "outside transactions" in meta and "producer " in meta and "UTC" in meta
    await screenshot(page, "messages")


async def test_a_time_starts_at_the_first_fragment_persisted_since(
        cluster: Cluster, page: Any) -> None:
    journal = "console/orders"
    await persisted_orders(cluster, journal, 2)
    fragments = await cluster.client.list_fragments(journal)
    persisted = [f.fragment for f in fragments if f.fragment.mod_time]
    assert len(persisted) >= 2
    since = persisted[1].mod_time
    first = min(f.begin for f in persisted if f.mod_time >= since)
    query = urllib.parse.urlencode({"journal": journal, "since": str(since)})
    await page.goto(cluster.url("writer", f"/messages?{query}"))
    assert f"from offset {first} (the first fragment persisted at or after" in \
        await text_of(page, "#summary")
    await page.goto(cluster.url("writer", f"/messages?journal={journal}&offset=-1"))
    assert await page.locator("#at-head").count() == 1


# -- hostile input ----------------------------------------------------------------------


async def test_hostile_content_is_shown_escaped(cluster: Cluster, page: Any) -> None:
    script = "<script>window.pwned = 1</script>"
    await cluster.client.append("console/hostile", json.dumps({"html": script}).encode()
                                + b"\n" + script.encode() + b" \x00\xff\n")
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    await page.goto(cluster.url("writer", "/messages?journal=console%2Fhostile&mode="
                                "uncommitted"))
    texts = await page.eval_on_selector_all("#messages li.message pre",
                                            "els => els.map(e => e.textContent)")
    assert json.loads(texts[0]) == {"html": script}
    assert texts[1] == script + " \\x00\\xff\\n"
    assert "not a message" in await text_of(page, "#messages li.bad")
    assert await page.evaluate("window.pwned") is None and dialogs == []
    await page.goto(cluster.url("writer", "/messages?journal=console%2Fraw"))
    assert "shown as lines of bytes" in await text_of(page, "main")


@pytest.mark.parametrize(("path", "status", "field", "says"), [
    ("/messages?journal=console/orders&offset=-5", 400, "offset", "must be at least 0"),
    ("/messages?journal=console/orders&offset=ten", 400, "offset", "expected a byte offset"),
    ("/messages?journal=console/orders&offset=99999999", 400, "offset",
     "past the write head of console/orders"),
    ("/messages?journal=console/orders&offset=" + "9" * 5000, 400, "offset",
     "a 5000-digit number"),
    ("/messages?journal=console/orders&limit=100000", 400, "limit",
     "must be at most 1000"),
    ("/messages?journal=console/orders&limit=0", 400, "limit", "must be at least 1"),
    ("/messages?journal=console/orders&mode=all", 400, "mode", "'all' is no mode"),
    ("/messages?journal=console/orders&since=someday", 400, "since", "is not a time"),
    ("/messages?journal=../../etc/passwd", 400, "journal", "must not contain a '..'"),
    ("/messages?journal=console/nope", 404, "journal", "there is no journal"),
    ("/journal?name=a%20b", 400, "name", "invalid character ' '"),
    ("/journal?name=", 400, "name", "give a journal name"),
    ("/journals?selector=name%20in%20(a", 400, "selector", "not a label selector"),
    ("/shard?id=bad%20shard", 400, "id", "invalid character"),
    ("/shard?id=shard-99", 404, "id", "has no shard 'shard-99'"),
    ("/shards?app=no-such-app", 404, "app", "no consumer application 'no-such-app'"),
    ("/events/dead-letters?topic=orders&group=a/b", 400, "group", "invalid character"),
    ("/events/dead-letters?topic=orders&group=billing&offset=99999999", 400, "offset",
     "past the write head"),
    ("/nothing/here", 404, "", "GET /nothing/here: Not Found"),
], ids=lambda value: str(value)[:40])
async def test_bad_input_is_a_clear_error_page(cluster: Cluster, page: Any, path: str,
                                               status: int, field: str, says: str) -> None:
    started = time.monotonic()
    reason = await error_page(page, cluster.url("writer", path), status)
    assert time.monotonic() - started < 5, "an error page is quick (nothing waits)"
    assert says in reason, reason
    if field:
        assert f"In {field}:" in reason
    assert "Traceback" not in await page.content()
    # The console keeps serving.
    response = await page.goto(cluster.url("writer", "/journals"))
    assert response.status == 200


async def test_html_in_a_name_is_escaped(cluster: Cluster, page: Any) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    script = "<script>alert(1)</script>"
    reason = await error_page(page, cluster.url(
        "writer", "/journal?name=" + urllib.parse.quote(script)), 400)
    assert script in reason and dialogs == []
    await screenshot(page, "error")


async def test_writes_from_elsewhere_are_refused(cluster: Cluster) -> None:
    url = cluster.url("writer", "/events/replay")
    form = {"csrf": cluster.consoles["writer"].csrf, "topic": "orders", "group": GROUP,
            "prefix": "events/"}
    async with aiohttp.ClientSession() as http:
        for headers, data, says in [
            ({"Origin": "http://evil.example"}, form, "from another site"),
            ({}, form, "has neither"),
            ({"Origin": cluster.url("writer", "")}, {**form, "csrf": "forged"},
             "reload the page"),
        ]:
            async with http.post(url, data=data, headers=headers) as r:
                assert r.status == 403 and says in await r.text(), (headers, data)
        async with http.get(url) as r:
            assert r.status == 405
    retry = await cluster.client.list(Selector.parse("name=events/orders/retry/billing"))
    assert retry.journals  # (nothing was replayed by those: the replay test counts)


async def test_an_unreachable_broker_is_a_503_page(cluster: Cluster, page: Any) -> None:
    config = cluster.console_config(*READER, broker_address=f"127.0.0.1:{free_port()}",
                                    consumer_address=f"127.0.0.1:{free_port()}",
                                    etcd_address="")
    async with Console(config) as console:
        reason = await error_page(page, console.url + "journals", 503)
        assert "Broker unreachable" in reason and "is a broker listening at" in reason
        reason = await error_page(page, console.url + "shards", 503)
        assert "Consumer member unreachable" in reason
        await page.goto(console.url + "members")
        assert "has no --etcd.address" in await text_of(page, "main")
        async with aiohttp.ClientSession() as http:
            async with http.get(console.url + "healthz") as r:
                assert r.status == 200
            async with http.get(console.url + "metrics") as r:
                assert "gazette_console_pages_total" in await r.text()
