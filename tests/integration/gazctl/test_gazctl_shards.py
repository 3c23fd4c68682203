"""`gazctl shards` against real consumer members (two, over a real etcd and broker):
list in every format with selectors, status, primary and lag; apply from a file; a stale
edit refused; unassign re-assigning a shard; hints (empty until recovery logs exist);
prune's message; and one-line errors for bad input.

Most commands run `run_async()` on the test's event loop (the members serve on it too);
edit runs `gazctl` as a process, for its real $EDITOR.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from gazette.allocator import assignments_of
from gazette.client import JournalClient, ShardClient
from gazette.consumer.member import ConsumerMember
from gazette.consumer.recovery import store_hints
from gazette.gazctl.__main__ import run_async
from gazette.keyspace import apply_changes
from gazette.protocol import ShardSource, ShardSpec, SpecChange
from gazette.recoverylog import Player, RecordedFolder
from gazette_broker import BrokerServer
from tests.fixtures.consumer import SHARDS, Group, primaries, publish
from tests.fixtures.polling import eventually
from tests.fixtures.procs import free_port, run_process

pytestmark = pytest.mark.integration

GAZCTL = str(Path(sys.executable).parent / "gazctl")


def _env(member: ConsumerMember | None, broker: BrokerServer | None,
         extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (
        "BROKER_ADDRESS", "CONSUMER_ADDRESS", "EDITOR", "LOG_LEVEL", "LOG_FORMAT")}
    if member is not None:
        env["CONSUMER_ADDRESS"] = f"127.0.0.1:{member.port}"
    if broker is not None:
        env["BROKER_ADDRESS"] = broker.grpc_address
    env.update(extra or {})
    return env


async def gazctl(member: ConsumerMember | None, *args: str, broker: BrokerServer | None = None,
                 env: dict[str, str] | None = None, stdin: bytes = b""
                 ) -> tuple[int, str, str]:
    """gazctl in this process with `member` as its consumer address: (exit status,
    stdout, stderr)."""
    out, err = io.BytesIO(), io.StringIO()
    code = await run_async(list(args), stdin=io.BytesIO(stdin), stdout=out, stderr=err,
                           env=_env(member, broker, env))
    return code, out.getvalue().decode(), err.getvalue()


def rows(table_text: str) -> list[list[str]]:
    """The cells of a table's header (first) and rows."""
    lines = table_text.splitlines()
    return [[c.strip() for c in line.split("|")[1:-1]] for line in [lines[1], *lines[3:-1]]]


def one_error_line(err: str) -> str:
    """The only line of `err` (asserting there is exactly one, and no traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


async def gazctl_process(member: ConsumerMember | None, *args: str,
                         env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`gazctl args...` as a process (for usage errors, which argparse writes to the
    process's own stderr, and $EDITOR): (exit status, stdout, stderr)."""
    code, out, err = await run_process([GAZCTL, *args], _env(member, None, env), timeout=60)
    return code, out.decode(), err


async def listed(member: ConsumerMember, selector: str = "") -> list[dict[str, object]]:
    code, out, err = await gazctl(member, "shards", "list", "-l", selector, "-o", "json")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


async def all_primary(member: ConsumerMember, selector: str, count: int) -> None:
    """Until `count` shards match `selector`, each with a running primary."""
    async def check() -> bool:
        shards = await listed(member, selector)
        return len(shards) == count and all(s["combined_status"] == "primary" for s in shards)

    await eventually(check, f"the {count} shards of {selector!r} list as primary", 30)


async def test_list_table_json_yaml_selectors_and_lag(group: Group, broker: BrokerServer
                                                      ) -> None:
    members, _ = group
    m0 = members[0]
    await all_primary(m0, "", len(SHARDS))

    code, out, err = await gazctl(m0, "shards", "list", "--primary")
    assert code == 0, err
    header, *body = rows(out)
    assert header == ["ID", "STATUS", "PRIMARY"]
    assert [r[0] for r in body] == SHARDS
    assert {r[1] for r in body} == {"primary"}
    assert {r[0]: r[2] for r in body} == primaries(members)

    for selector, expected in [("id=shard-1", ["shard-1"]),
                               ("id in (shard-0, shard-3)", ["shard-0", "shard-3"]),
                               ("id not in (shard-0)", SHARDS[1:])]:
        code, out, _ = await gazctl(m0, "shards", "list", "-l", selector)
        assert code == 0 and [r[0] for r in rows(out)[1:]] == expected, selector

    objs = await listed(m0, "id=shard-2")
    assert [o["id"] for o in objs] == ["shard-2"]
    route = objs[0]["route"]
    assert isinstance(route, dict) and [m["suffix"] for m in route["members"]] == [
        primaries(members)["shard-2"]]
    assert route["endpoints"] and route["primary"] == 0
    assert objs[0]["status"] == [{"state": "primary", "error": ""}]
    assert isinstance(objs[0]["mod_revision"], int) and objs[0]["mod_revision"] > 0
    assert objs[0]["spec"] == {"id": "shard-2", "sources": [{"journal": "counts/in-2"}],
                               "max_txn_duration": "1s", "min_txn_duration": "0s",
                               "hot_standbys": 0, "ring_buffer_size": 8192,
                               "read_channel_size": 4096}

    code, out, _ = await gazctl(m0, "shards", "list", "-l", "id=shard-2", "-o", "yaml")
    doc = yaml.safe_load(out)
    assert code == 0 and doc["id"] == "shard-2" and doc["revision"] == objs[0]["mod_revision"]

    # Lag: after input is published and read through, each shard's lag is 0 bytes, of
    # sources whose write heads are past 0.
    async with JournalClient(broker.grpc_address) as journals, \
            ShardClient(f"127.0.0.1:{m0.port}") as shards:
        await publish(journals, 40)
        for i, shard in enumerate(SHARDS):
            head = await journals.write_head(f"counts/in-{i}")
            assert head > 0
            stat = await shards.stat(shard, {f"counts/in-{i}": head}, timeout=20)
            assert stat.read_through[f"counts/in-{i}"] == head
    code, out, err = await gazctl(m0, "shards", "list", "--lag", broker=broker)
    assert code == 0, err
    header, *body = rows(out)
    assert header == ["ID", "STATUS", "LAG"] and [r[2] for r in body] == ["0"] * 4
    code, out, err = await gazctl(m0, "shards", "list", "--lag", "-o", "json", broker=broker)
    assert code == 0 and [json.loads(line)["lag"] for line in out.splitlines()] == [0] * 4


SPECS = """
id: extra/
sources: [{journal: counts/in-0}]
children:
  - id: extra/a
  - id: extra/b
    disable: true
"""


async def test_apply_from_a_file_then_list(group: Group, broker: BrokerServer,
                                           tmp_path: Path) -> None:
    m0 = group[0][0]
    path = tmp_path / "shards.yaml"
    path.write_text(SPECS)

    code, out, err = await gazctl(m0, "shards", "apply", "-f", str(path), "--dry-run")
    assert code == 0 and out.splitlines() == ["upsert extra/a (new)", "upsert extra/b (new)"]
    assert "dry run: nothing was applied changes=2" in err
    assert await listed(m0, "prefix=extra/") == []

    # (the broker is asked whether the source journals exist)
    code, _, err = await gazctl(m0, "shards", "apply", "-f", str(path), broker=broker)
    assert code == 0 and "successfully applied revision=" in err, err
    await all_primary(m0, "id=extra/a", 1)
    code, out, _ = await gazctl(m0, "shards", "list", "-l", "prefix=extra/")
    assert rows(out)[1:] == [["extra/a", "primary"], ["extra/b", "disabled"]]

    # Without revisions the specs say "new": applying them again is refused, by name.
    revision = (await listed(m0, "id=extra/a"))[0]["mod_revision"]
    code, _, err = await gazctl(m0, "shards", "apply", stdin=SPECS.encode(), broker=broker)
    assert code == 1
    assert one_error_line(err).startswith(
        f"gazctl: not applied: extra/a already exists (at revision {revision}; give its "
        "revision: to change it)")
    assert err.strip().endswith("list the shards again and re-apply your changes")


async def test_a_stale_edit_is_refused(group: Group, tmp_path: Path) -> None:
    m0 = group[0][0]
    before = (await listed(m0, "id=shard-1"))[0]["mod_revision"]
    # The editor: while the user edits, someone else edits shard-1 (a nested gazctl
    # edit); then the user's change is saved, at the revision listed before.
    editor = tmp_path / "editor.sh"
    editor.write_text(
        f'EDITOR="sed -i s/max_txn_duration:\\ 1s/max_txn_duration:\\ 2s/" {GAZCTL} '
        "shards edit -l id=shard-1 || exit 1\n"
        'sed -i "s/ring_buffer_size: 8192/ring_buffer_size: 4096/" "$1"\n')
    code, _, err = await gazctl_process(m0, "shards", "edit", "-l", "id=shard-1",
                                        env={"EDITOR": f"sh {editor}"})
    assert code == 1, err
    now = (await listed(m0, "id=shard-1"))[0]
    line = err.strip().splitlines()[-1]
    assert line.startswith(
        f"gazctl: not applied: the spec of shard-1 changed since revision {before} (it is "
        f"now at revision {now['mod_revision']}); list the shards again and re-apply your "
        "changes (your edit is kept in "), err
    kept = Path(line.rsplit("kept in ", 1)[1].rstrip(")"))
    assert "ring_buffer_size: 4096" in await asyncio.to_thread(kept.read_text)
    await asyncio.to_thread(kept.unlink)
    spec = now["spec"]
    assert isinstance(spec, dict)
    assert spec["max_txn_duration"] == "2s" and spec["ring_buffer_size"] == 8192


async def test_unassign_reassigns_a_shard(group: Group) -> None:
    members, _ = group
    m0 = members[0]
    await all_primary(m0, "", len(SHARDS))

    def assigned() -> int:
        """The latest mod revision of shard-0's assignments (0: none)."""
        return max((a.mod_revision for a in assignments_of(m0.keyspace, m0.layout,
                                                           "shard-0")), default=0)

    before = assigned()
    code, out, err = await gazctl(m0, "shards", "unassign", "-l", "id=shard-0", "--dry-run")
    assert code == 0 and out.splitlines() == ["shard-0"]
    assert "dry run: nothing was unassigned shards=1" in err
    code, out, err = await gazctl(m0, "shards", "unassign", "-l", "id in (shard-0, shard-1)",
                                  "--failed")
    assert code == 0 and out == "" and "none has a failed replica" in err, err
    assert assigned() == before

    code, out, err = await gazctl(m0, "shards", "unassign", "-l", "id=shard-0")
    assert code == 0 and out.splitlines() == ["shard-0"], err
    await eventually(lambda: assigned() > before, "shard-0 is assigned anew", timeout=20)
    await all_primary(m0, "id=shard-0", 1)


PRUNE_SPECS = """
id: logged/
sources: [{journal: counts/in-3}]
recovery_log_prefix: recovery
hint_prefix: /gazette/hints
disable: true
children:
  - id: logged/a
"""


async def test_hints_are_empty_and_prune_has_nothing_to_do(group: Group,
                                                           broker: BrokerServer) -> None:
    m0 = group[0][0]
    code, out, err = await gazctl(m0, "shards", "hints", "--shard", "shard-0")
    assert code == 0, err
    assert yaml.safe_load(out) == {"shard": "shard-0", "primary_hints": None,
                                   "backup_hints": []}
    assert "shard shard-0 has no recovery-log hints: it has not recovered" in err
    code, out, _ = await gazctl(m0, "shards", "hints", "--shard", "shard-0", "-o", "json")
    assert code == 0 and json.loads(out)["primary_hints"] is None

    code, _, err = await gazctl(m0, "shards", "apply", stdin=PRUNE_SPECS.encode(),
                                broker=broker)
    assert code == 0, err
    await eventually(lambda: _listed_count(m0, "prefix=logged/", 1), "logged/a lists")
    code, out, err = await gazctl(m0, "shards", "prune")
    assert code == 0, err
    assert "shard logged/a has no hints" in err and "its log is kept whole" in err
    assert out.splitlines()[-1].startswith("pruned 0 fragments (0 B) of 0 journals")
    code, out, _ = await gazctl(m0, "shards", "prune", "-l", "id=shard-0")
    assert code == 0
    assert out.splitlines()[-1] == "None of the selected shards has a recovery_log_prefix."


async def test_prune_removes_log_fragments_no_hint_needs(
        group: Group, broker: BrokerServer, consumer_root: str, tmp_path: Path) -> None:
    m0 = group[0][0]
    spec = ShardSpec("pruned/a", (ShardSource("counts/in-3"),), recovery_log_prefix="rlog",
                     hint_prefix=f"{consumer_root}/hints", disable=True)
    log = "rlog/pruned/a"
    await broker.apply_yaml(f"name: {log}\nreplication: 1\nfragment:\n"
                            "  stores: [file:///]\n  compression_codec: NONE\n")
    await apply_changes(m0.etcd, m0.layout, [SpecChange(spec.id, 0, spec)])
    async with JournalClient(broker.grpc_address) as client:
        # A store's life: its state file replaced six times, a fragment each.
        root = tmp_path / "store"
        folder = RecordedFolder(root, await Player(client, log, root).handoff(7))
        for i in range(6):
            folder.replace("state.json", b'{"n": %d}' % i)
            await folder.commit()
            await broker.broker.replicas[log].roll()
        await asyncio.wait_for(broker.broker.persister.wait_idle(), 10)
        assert folder.hints is not None
        await store_hints(m0.etcd, spec, folder.hints)
        await eventually(lambda: _listed_count(m0, "prefix=pruned/", 1), "pruned/a lists")

        code, out, err = await gazctl(m0, "shards", "prune", "--dry-run", broker=broker)
        assert code == 0, err
        assert out.splitlines()[-1].startswith("would prune 5 fragments"), out
        assert broker.file_root is not None
        code, out, err = await gazctl(m0, "shards", "prune", "-l", "id=pruned/a",
                                      "--file-root", str(broker.file_root), broker=broker)
        assert code == 0, err
        assert out.splitlines()[-1].startswith("pruned 5 fragments"), out
        # The log's start is gone from the store; the hints still rebuild the state.
        assert len(list((broker.file_root / log).iterdir())) == 1
        copy = Player(client, log, tmp_path / "copy", folder.hints)
        await copy.play()
        await copy.finish()
        assert (tmp_path / "copy" / "state.json").read_bytes() == b'{"n": 5}'


async def _listed_count(member: ConsumerMember, selector: str, count: int) -> bool:
    return len(await listed(member, selector)) == count


async def test_bad_input_is_one_clear_line(group: Group, tmp_path: Path) -> None:
    m0 = group[0][0]
    code, _, err = await gazctl_process(m0, "shards", "list", "-l", "id in (")
    assert code == 2 and "argument -l/--selector: bad selector" in one_error_line(err)

    bad = tmp_path / "bad.yaml"
    for text, expected in [
            ("id: x\nsources: 5\n", "invalid shard specs: x: sources: expected a list"),
            ("id: x\nsources: [{journal: a/b}]\nbogus: 1\n", "x: bogus: unknown field"),
            ("id: [\n", "invalid shard specs: yaml: line 2"),
            ("id: x\nsources: [{journal: a/b}]\nmax_txn_duration: 2h\n",
             "x: max_txn_duration:")]:
        bad.write_text(text)
        code, _, err = await gazctl(m0, "shards", "apply", "-f", str(bad))
        assert code == 1, text
        assert one_error_line(err).startswith(f"gazctl: {bad}: "), err
        assert expected in err, (text, err)

    code, _, err = await gazctl(m0, "shards", "hints", "--shard", "no-such-shard")
    assert code == 1 and one_error_line(err) == \
        "gazctl: SHARD_NOT_FOUND for shard no-such-shard"
    code, _, err = await gazctl_process(m0, "shards", "hints", "--shard", "bad#id")
    assert code == 2 and "argument --shard: bad shard ID 'bad#id'" in one_error_line(err)
    code, _, err = await gazctl(m0, "shards", "unassign", "-l", "id=nope")
    assert code == 1 and one_error_line(err) == \
        "gazctl: no shards match the selector 'id=nope'"

    port = free_port()  # nothing listens there
    code, _, err = await gazctl(None, "shards", "list",
                                env={"CONSUMER_ADDRESS": f"127.0.0.1:{port}"})
    assert code == 1
    line = one_error_line(err)
    assert line.startswith(f"gazctl: list via consumer member 127.0.0.1:{port} failed")
    assert line.endswith(f"(is a consumer member listening at 127.0.0.1:{port}? the "
                         "address came from $CONSUMER_ADDRESS)")
    code, _, err = await gazctl(None, "shards", "list", "--consumer.address", "nope")
    assert code == 2 and one_error_line(err) == (
        "gazctl: consumer address from --consumer.address: 'nope' is not host:port (e.g. "
        "localhost:8080 or http://broker:8080)")
    code, _, err = await gazctl(m0, "shards", "list", "--lag",
                                env={"BROKER_ADDRESS": f"127.0.0.1:{port}"})
    assert code == 1 and "(is a broker listening at" in one_error_line(err)
