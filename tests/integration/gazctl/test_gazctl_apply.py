"""`gazctl journals apply` and `edit` of more changes than one etcd transaction takes:
batches of at most --max-txn-size, each its own Apply, against a real broker. gazctl
runs as a process."""

from __future__ import annotations

import json

import pytest

from gazette_broker import BrokerServer
from tests.fixtures.polling import eventually
from tests.integration.gazctl.test_gazctl import gazctl, names_in

pytestmark = pytest.mark.integration


def tree(group: str, count: int) -> str:
    """A spec tree of `count` journals ``{group}j-0000``, ... (replication 1, no stores)."""
    children = "".join(f"- name: {group}j-{i:04d}\n" for i in range(count))
    return f"name: {group}\nreplication: 1\nchildren:\n{children}"


async def listed(server: BrokerServer, selector: str) -> list[str]:
    """The names `gazctl journals list -l selector` shows."""
    code, out, err = await gazctl(server, "journals", "list", "-l", selector)
    assert code == 0, err
    return names_in(out)


async def lists(server: BrokerServer, selector: str, expected: list[str],
                timeout: float = 30) -> None:
    """Until the listing is `expected` (the broker lists from its copy of etcd, which
    catches up with an Apply soon after it returns)."""
    async def check() -> bool:
        return await listed(server, selector) == expected

    await eventually(check, f"{selector} lists {len(expected)} journals", timeout)


def log_fields(err: str, message: str) -> list[dict[str, str]]:
    """The key=value fields of each log line of `err` carrying `message`."""
    return [dict(f.split("=", 1) for f in line.split(message, 1)[1].split())
            for line in err.splitlines() if message in line]


async def test_apply_a_thousand_journals_in_batches(
        broker_server: BrokerServer) -> None:
    server = broker_server
    code, _, err = await gazctl(server, "journals", "apply",
                                stdin=tree("many/", 1000).encode(), timeout=120)
    assert code == 0, err[-2000:]
    assert ("applying 1000 changes in 8 batches of at most 128; each batch is atomic, the "
            "whole is not") in err
    batches = log_fields(err, "applied batch")
    assert [b["batch"] for b in batches] == [f"{n}/8" for n in range(1, 9)]
    assert [int(b["changes"]) for b in batches] == [128] * 7 + [104]
    revisions = [int(b["revision"]) for b in batches]
    assert revisions == sorted(set(revisions))  # eight transactions, one after another
    assert err.strip().splitlines()[-1].endswith(f"successfully applied revision={revisions[-1]}")
    await lists(server, "prefix=many/", [f"many/j-{i:04d}" for i in range(1000)], timeout=120)


async def test_edit_applies_in_batches(broker_server: BrokerServer) -> None:
    server = broker_server
    code, _, err = await gazctl(server, "journals", "apply", stdin=tree("few/", 10).encode())
    assert code == 0, err
    await lists(server, "prefix=few/", [f"few/j-{i:04d}" for i in range(10)])
    # Each change at the revision it was listed at, at most 4 in one transaction.
    code, _, err = await gazctl(server, "journals", "edit", "-l", "prefix=few/",
                                "--max-txn-size", "4",
                                env={"EDITOR": "sed -i 's/length: .*/length: 1048576/'"})
    assert code == 0, err
    assert ("applying 10 changes in 3 batches of at most 4; each batch is atomic, the whole "
            "is not") in err
    assert [int(b["changes"]) for b in log_fields(err, "applied batch")] == [4, 4, 2]

    async def edited() -> bool:
        code, out, err = await gazctl(server, "journals", "list", "-l", "prefix=few/",
                                      "--format", "json")
        assert code == 0, err
        specs = [json.loads(line)["spec"] for line in out.splitlines()]
        return len(specs) == 10 and {s["fragment"]["length"] for s in specs} == {1048576}

    await eventually(edited, "the 10 journals list the edited length", timeout=30)


async def test_a_failed_batch_names_what_was_and_was_not_applied(
        broker_server: BrokerServer) -> None:
    server = broker_server
    # part/j-0250 exists already, so the tree's spec for it (no revision:) is stale.
    existing = await server.apply_yaml("name: part/j-0250\nreplication: 1\n")
    specs = tree("part/", 500).encode()
    code, out, err = await gazctl(server, "journals", "apply", "--max-txn-size", "100",
                                  "--dry-run", stdin=specs)
    assert code == 0 and len(out.splitlines()) == 500
    assert "dry run: nothing was applied changes=500 batches=5" in err

    code, _, err = await gazctl(server, "journals", "apply", "--max-txn-size", "100",
                                stdin=specs, timeout=60)
    assert code == 1 and "Traceback" not in err, err
    applied = log_fields(err, "applied batch")
    assert [b["batch"] for b in applied] == ["1/5", "2/5"]
    assert err.strip().splitlines()[-1] == (
        f"gazctl: batch 3 of 5 was not applied: part/j-0250 already exists (at revision "
        f"{existing}; give its revision: to change it); batches 1-2 were applied (changes "
        f"1-200: part/j-0000 to part/j-0199; revision {applied[1]['revision']}); not "
        "applied: batches 3-5 (changes 201-500: part/j-0200 to part/j-0499); list the "
        "journals again and re-apply those")
    # Batch 3 is atomic: none of it went, not even the journals before the stale one.
    await lists(server, "prefix=part/", [f"part/j-{i:04d}" for i in range(200)] +
                ["part/j-0250"])

    # A first batch that fails: nothing was applied.
    await server.apply_yaml("name: first/j-0001\nreplication: 1\n")
    code, _, err = await gazctl(server, "journals", "apply", "--max-txn-size", "2",
                                stdin=tree("first/", 4).encode())
    assert code == 1, err
    assert err.strip().splitlines()[-1].startswith(
        "gazctl: batch 1 of 2 was not applied: first/j-0001 already exists")
    assert err.strip().endswith("; no batch was applied; list the journals again and "
                                "re-apply your changes")
    assert await listed(server, "prefix=first/") == ["first/j-0001"]
