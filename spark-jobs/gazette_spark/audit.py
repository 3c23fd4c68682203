"""Audit journals' fragments: every one read whole and its SHA-1 and length checked, and
each journal's offsets checked for holes and overlaps.

    python -m gazette_spark.audit --journals prefix=events/ --stores s3://bucket/ \\
        [--output report.json]

With ``--stores`` every copy of a fragment in every store is checked; through
``--broker``, the copies the broker lists. The report (JSON, to ``--output`` or stdout)
has per journal its fragments, bytes, offsets, holes (ranges no fragment holds, after
the first fragment), pending ranges (through ``--broker``: gaps the broker lists
fragments not persisted yet for, since brokers persist out of order; no fault), overlaps
(fragments that partly overlap: harmless, read once) and bad fragments with the
reason. Exit status 1 when a fragment is bad or a journal has a hole, so a scheduled
audit fails visibly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from gazette.fragment import Fragment
from gazette_spark import cli
from gazette_spark.plan import Piece, discover, persisted
from gazette_spark.slices import DATA_LOSS_ERRORS, piece_content

log = logging.getLogger("gazette_spark")


def check_fragment(item: tuple[Fragment, str]) -> tuple[str, str, str]:
    """(journal, where, "" or why it is bad): the fragment read whole and verified."""
    fragment, url = item
    where = f"{fragment.backing_store}{fragment.path}"
    try:
        for _ in piece_content(Piece(fragment, fragment.begin, fragment.end, url)):
            pass
    except DATA_LOSS_ERRORS as err:
        return fragment.journal, where, str(err)
    return fragment.journal, where, ""


def offsets_report(fragments: list[Fragment], unpersisted: Sequence[Fragment] = ()
                   ) -> dict[str, Any]:
    """Offsets, holes and overlaps of one journal's persisted fragments (copies counted
    once); a journal with none yet has null offsets. A gap a broker lists `unpersisted`
    fragments for is `pending` (an upload under way: brokers persist out of order), not
    a hole."""
    if not fragments:
        return {"fragments": 0, "bytes": 0, "begin": None, "end": None, "holes": [],
                "pending": [], "overlaps": []}
    ranges = sorted({(f.begin, f.end) for f in fragments})
    holes: list[list[int]] = []
    pending: list[list[int]] = []
    overlaps: list[list[int]] = []
    reach = ranges[0][1]
    for begin, end in ranges[1:]:
        if begin > reach:
            covered = all(any(u.begin <= at < u.end for u in unpersisted)
                          for at in (reach, begin - 1))
            (pending if covered else holes).append([reach, begin])
        elif begin < reach and end > reach:
            overlaps.append([begin, reach])
        reach = max(reach, end)
    return {"fragments": len(fragments), "bytes": sum(f.size for f in fragments),
            "begin": ranges[0][0], "end": reach, "holes": holes, "pending": pending,
            "overlaps": overlaps}


def run(argv: Sequence[str] | None = None) -> int:
    p = cli.parser("audit", __doc__.splitlines()[0])
    p.add_argument("--output", default="", help="file of the JSON report (default stdout)")
    args = p.parse_args(argv)
    opts = cli.check(cli.source_options(args))
    listed = asyncio.run(discover(opts))
    found = persisted(listed)
    cli.warn_if_empty(found, opts)
    items = [item for journal in sorted(found) for item in found[journal]]
    total = sum(f.size for f, _ in items)
    log.info("audit: %d journals, %d fragments, %.1f MiB", len(found), len(items),
             total / (1 << 20))
    spark = cli.session(args, "audit")
    checked: list[tuple[str, str, str]] = []
    if items:
        rdd = spark.sparkContext.parallelize(items, max(1, min(len(items), 256)))
        with cli.progress(spark, None, args.progress_interval):
            checked = rdd.map(check_fragment).collect()
    report: dict[str, Any] = {}
    for journal in sorted(found):
        entry = offsets_report([f for f, _ in found[journal]],
                               [f for f, _ in listed[journal] if not f.backing_store])
        entry["bad"] = [{"fragment": where, "reason": why}
                        for j, where, why in checked if j == journal and why]
        report[journal] = entry
    bad = sum(len(e["bad"]) for e in report.values())
    holes = sum(len(e["holes"]) for e in report.values())
    text = json.dumps(report, indent=2, sort_keys=True)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    log.info("audit: %d fragments checked, %d bad, %d holes, %d overlaps", len(checked),
             bad, holes, sum(len(e["overlaps"]) for e in report.values()))
    return 1 if bad or holes else 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main_guard(run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
