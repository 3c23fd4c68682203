"""The events pages: topics (their partition journals) and consumer groups (their retry
and dead-letter journals), a group's dead letters, and their replay into the group's
retry journal. Dead letters are read and replayed by gazctl's own functions
(`gazette.gazctl.events_cmd`), so the page and ``gazctl events`` agree."""

from __future__ import annotations

import argparse
import io
from collections.abc import Mapping
from typing import Any

from gazette.auth import Capability
from gazette.console.backend import Backend
from gazette.console.journal_pages import link, write_heads
from gazette.console.views import (
    BadInput,
    Forbidden,
    NotFound,
    bad,
    human_bytes,
    param,
    pretty,
)
from gazette.errors import ValidationError
from gazette.events.topic import (
    DEAD,
    DEFAULT_PREFIX,
    GROUP_LABEL,
    RETRY,
    ROLE_LABEL,
    TOPIC_LABEL,
    group_journal,
    validate_name,
)
from gazette.gazctl.events_cmd import cmd_replay, offset_arg, read_dead_letters
from gazette.labels import journal_labels
from gazette.names import validate_prefix

Page = tuple[str, dict[str, Any]]

#: What a replay needs of the token: it reads the dead letters and appends them.
REPLAY_NEEDS = (Capability.READ, Capability.APPEND)


def split_group_journal(name: str) -> tuple[str, str, str, str]:
    """A retry or dead-letter journal's prefix, topic, role and group
    (``<prefix><topic>/<role>/<group>``)."""
    *folders, topic, role, group = name.split("/")
    return "".join(f"{f}/" for f in folders), topic, role, group


async def events(backend: Backend, query: Mapping[str, str]) -> Page:
    client = backend.client
    topics: dict[tuple[str, str], list[str]] = {}
    for j in (await client.list(TOPIC_LABEL)).journals:
        for topic in j.spec.labels.values(TOPIC_LABEL):
            prefix = j.spec.name[:j.spec.name.find(f"{topic}/")] \
                if f"{topic}/" in j.spec.name else ""
            topics.setdefault((prefix, topic), []).append(j.spec.name)
    groups: dict[tuple[str, str, str], dict[str, str]] = {}
    for j in (await client.list(GROUP_LABEL)).journals:
        if len(j.spec.name.split("/")) < 3:
            continue
        prefix, topic, role, group = split_group_journal(j.spec.name)
        if role in (RETRY, DEAD) and group in j.spec.labels.values(GROUP_LABEL) and \
                role in j.spec.labels.values(ROLE_LABEL):
            groups.setdefault((prefix, topic, group), {})[role] = j.spec.name
    dead = sorted(g[DEAD] for g in groups.values() if DEAD in g)
    heads = await write_heads(backend, dead)
    rows = []
    for (prefix, topic, group), journals in sorted(groups.items()):
        head = heads.get(journals.get(DEAD, ""))
        rows.append({"prefix": prefix, "topic": topic, "group": group,
                     "retry": journals.get(RETRY, ""), "dead": journals.get(DEAD, ""),
                     "dead_size": human_bytes(head) if isinstance(head, int) else head,
                     "link": link("/events/dead-letters", topic=topic, group=group,
                                  prefix=prefix)})
    return "events.html", {
        "topics": [{"prefix": p, "topic": t, "partitions": sorted(names)}
                   for (p, t), names in sorted(topics.items())],
        "groups": rows}


def group_params(values: Mapping[str, str]) -> tuple[str, str, str]:
    """The topic, group and prefix a dead-letters page or a replay names, checked as
    gazctl checks them."""
    out = []
    for name in ("topic", "group"):
        try:
            out.append(validate_name(param(values, name), name))
        except ValidationError as err:
            raise bad(err, name) from None
    prefix = param(values, "prefix") or DEFAULT_PREFIX
    try:
        validate_prefix(prefix, "prefix")
    except ValidationError as err:
        raise bad(err, "prefix") from None
    if not prefix.endswith("/"):
        raise BadInput(f"{prefix!r} must end with '/'", field="prefix")
    return out[0], out[1], prefix


def offset_of(values: Mapping[str, str]) -> int:
    text = param(values, "offset") or "0"
    try:
        return offset_arg(text)
    except (ValueError, argparse.ArgumentTypeError) as err:
        raise BadInput(str(err), field="offset") from None


async def can_replay(backend: Backend, retry: str) -> bool:
    """Whether the token allows appending to `retry` (and reading the dead letters)."""
    try:
        found = await backend.journal(retry)
    except NotFound:
        return False
    return backend.allows(REPLAY_NEEDS, journal_labels(retry, found.spec.labels))


async def dead_letters(backend: Backend, query: Mapping[str, str]) -> Page:
    topic, group, prefix = group_params(query)
    offset = offset_of(query)
    dead, retry = (group_journal(topic, group, role, prefix) for role in (DEAD, RETRY))
    head = await backend.client.write_head(dead)
    if offset > head:
        raise BadInput(f"offset {offset} is past the write head of {dead} ({head})",
                       field="offset")
    hint = f"is topic {topic} consumed by group {group}?"
    letters, head = await read_dead_letters(backend.gazctl(), dead, offset, hint)
    rows = [{"offset": d.offset, "id": d.text("id"), "handler": d.text("handler"),
             "attempt": d.text("attempt"), "error": " ".join(d.text("error").split()),
             "source": d.text("source"), "data": pretty(d.fields.get("data"))}
            for d in letters]
    return "dead_letters.html", {
        "topic": topic, "group": group, "prefix": prefix, "dead": dead, "retry": retry,
        "offset": offset, "head": head, "rows": rows,
        "replay": await can_replay(backend, retry),
        "next_link": link("/events/dead-letters", topic=topic, group=group, prefix=prefix,
                          offset=head)}


async def replay(backend: Backend, form: Mapping[str, str]) -> Page:
    """Replays the dead letters from the form's offset (only those of its event id, if
    it names one), as ``gazctl events replay`` does; refused unless the token allows."""
    topic, group, prefix = group_params(form)
    offset = offset_of(form)
    event_id = param(form, "id") or None
    retry = group_journal(topic, group, RETRY, prefix)
    if not await can_replay(backend, retry):
        raise Forbidden(f"the console's token does not allow appending to {retry} "
                        f"(replay needs {', '.join(c.value for c in REPLAY_NEEDS)})")
    ctx = backend.gazctl()
    args = argparse.Namespace(topic=topic, group=group, prefix=prefix, offset=offset,
                              handler=None, id=event_id, dry_run=False)
    await cmd_replay(ctx, args)
    out = ctx.stdout
    assert isinstance(out, io.BytesIO), "the console's gazctl context keeps its output"
    return "replayed.html", {
        "topic": topic, "group": group, "prefix": prefix, "retry": retry,
        "output": out.getvalue().decode(errors="replace"),
        "back_link": link("/events/dead-letters", topic=topic, group=group,
                          prefix=prefix, offset=offset)}
