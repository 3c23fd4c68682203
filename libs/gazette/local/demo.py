"""The local cluster demo: a real etcd on embedded defaults, the tutorial's journals
applied to it, and the cluster's state shown back. (`make demo`)"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
from pathlib import Path
from typing import TextIO

import uvloop

from gazette.keyspace import Etcd, KeySpace, Layout, TxnConflict
from gazette.keyspace.specs import Decoder, apply_changes
from gazette.labels import Selector, journal_labels
from gazette.local.etcd import EmbeddedEtcd
from gazette.local.tutorial import TUTORIAL_JOURNALS_YAML, TUTORIAL_SELECTIONS
from gazette.protocol import JournalSpec
from gazette.protocol.trees import SpecChange, journal_changes_from_yaml, specs_to_yaml


async def run_demo(etcd_endpoint: str, out: TextIO, layout: Layout | None = None) -> None:
    """Apply the tutorial journals to the cluster at `etcd_endpoint` and show its state."""
    layout = layout or Layout.brokers()
    async with Etcd(etcd_endpoint) as etcd:
        keyspace: KeySpace[object] = KeySpace(etcd, layout.root + "/", Decoder(layout))
        async with keyspace:
            changes = journal_changes_from_yaml(TUTORIAL_JOURNALS_YAML)
            # Re-running against a kept cluster updates in place, at the current revisions.
            changes = [SpecChange(c.name, _mod_revision(keyspace, layout, c.name), c.spec)
                       for c in changes]
            revision = await apply_changes(etcd, layout, changes)
            await keyspace.wait_for_revision(revision, timeout=10)
            print(f"Applied {len(changes)} journal specs at etcd revision {revision}.", file=out)

            journals = [(e.value, e.mod_revision) for e in keyspace.prefixed(layout.items)
                        if isinstance(e.value, JournalSpec)]
            members = keyspace.prefixed(layout.members)
            assignments = keyspace.prefixed(layout.assignments)
            print(f"\nCluster {layout.root} at revision {keyspace.revision}: "
                  f"{len(journals)} journals, {len(members)} brokers, "
                  f"{len(assignments)} assignments.", file=out)
            print("\nJournal specs, folded into the smallest tree "
                  "(`journals list --format yaml`):\n", file=out)
            print(_indent(specs_to_yaml(journals)), file=out)

            print("Selecting journals by label:", file=out)
            for text, _ in TUTORIAL_SELECTIONS:
                selector = Selector.parse(text)
                names = [spec.name for spec, _ in journals
                         if selector.matches(journal_labels(spec.name, spec.labels))]
                print(f"  -l {text!r:48} -> {', '.join(names) or '(none)'}", file=out)

            # Optimistic concurrency: an edit based on a stale read is refused, cleanly.
            spec, seen = journals[0]
            await apply_changes(etcd, layout, [SpecChange(spec.name, seen, spec)])
            try:
                await apply_changes(etcd, layout, [SpecChange(spec.name, seen, spec)])
            except TxnConflict as err:
                print(f"\nA second edit of {spec.name} at its old revision is refused:\n"
                      f"  {err}", file=out)


def _mod_revision(keyspace: KeySpace[object], layout: Layout, name: str) -> int:
    entry = keyspace.get(layout.item_key(name))
    return entry.mod_revision if entry else 0


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" for line in text.splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gazette.local",
        description="Start a local Gazette cluster on embedded defaults and show its state.")
    parser.add_argument("--data-dir", type=Path,
                        help="keep etcd's data here (default: a temporary directory)")
    parser.add_argument("--etcd-port", type=int, default=0,
                        help="etcd client port (default: a free port)")
    parser.add_argument("--keep-running", action="store_true",
                        help="leave the cluster running until interrupted")
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        data_dir = args.data_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="gazette-local-")))
        print("Starting a local Gazette cluster on embedded defaults.")
        etcd = stack.enter_context(EmbeddedEtcd(data_dir / "etcd", args.etcd_port))
        print(f"  etcd {etcd.version()} at {etcd.endpoint} (pid {etcd.pid}, "
              f"data in {etcd.data_dir})")
        uvloop.run(run_demo(etcd.endpoint, sys.stdout))
        if args.keep_running:
            print(f"\nRunning; try: ETCDCTL_API=3 etcdctl --endpoints {etcd.endpoint} "
                  "get --prefix /gazette --keys-only. Ctrl-C stops.")
            with contextlib.suppress(KeyboardInterrupt):
                signal.sigwait({signal.SIGINT, signal.SIGTERM})
        print("\nStopping etcd.")
    return 0
