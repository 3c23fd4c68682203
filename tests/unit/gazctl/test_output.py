"""gazctl's output: the tutorial's tables, sizes and ages, log lines, the progress bar."""

from __future__ import annotations

import io
import json
import logging

import pytest

from gazette.client import FragmentInfo, ListedJournal, Route
from gazette.fragment import Fragment
from gazette.gazctl.fragments import (
    PruneStats,
    fragment_to_dict,
    fragments_table,
)
from gazette.gazctl.journals import journal_to_dict, journals_table
from gazette.gazctl.output import (
    JsonFormatter,
    Progress,
    TextFormatter,
    ago,
    human_bytes,
    table,
)
from gazette.labels import LabelSet
from gazette.protocol import CompressionCodec, JournalSpec, ProcessId

SHA1 = bytes.fromhex("92a7ee0e4be7a03fd1a3224055a9d6b7bbd6125e")


def test_table_is_the_tutorials_box() -> None:
    out = table(["name", "primary"], [["example/journal", "busy-walrus"],
                                      ["foobar/part-000", "busy-walrus"]])
    assert out == """\
+-----------------+-------------+
|      NAME       |   PRIMARY   |
+-----------------+-------------+
| example/journal | busy-walrus |
| foobar/part-000 | busy-walrus |
+-----------------+-------------+"""


def test_table_right_aligns_numbers_and_takes_no_rows() -> None:
    lines = table(["offset", "length"], [["0", "43 B"], ["2365", "2.5 KiB"]]).splitlines()
    assert lines[1] == "| OFFSET | LENGTH  |"
    assert lines[3] == "|      0 | 43 B    |"
    assert lines[4] == "|   2365 | 2.5 KiB |"
    assert table(["name"], []).splitlines() == ["+------+", "| NAME |", "+------+", "+------+"]
    with pytest.raises(ValueError, match="row 0 has 1 cells"):
        table(["a", "b"], [["x"]])


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (9, "9 B"), (43, "43 B"), (1023, "1023 B"), (1024, "1.0 KiB"),
    (2355, "2.3 KiB"), (2560, "2.5 KiB"), (12_000, "12 KiB"), (1 << 20, "1.0 MiB"),
    (5 * (1 << 30), "5.0 GiB"),
])
def test_human_bytes_like_go_humanize(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0.5, "now"), (1, "1 second ago"), (42, "42 seconds ago"), (60, "1 minute ago"),
    (8 * 60 + 5, "8 minutes ago"), (3600, "1 hour ago"), (5 * 3600, "5 hours ago"),
    (86400, "1 day ago"), (3 * 86400, "3 days ago"), (8 * 86400, "1 week ago"),
    (40 * 86400, "1 month ago"), (400 * 86400, "1 year ago"), (800 * 86400, "2 years ago"),
    (-90, "1 minute from now"),
])
def test_ago(seconds: float, text: str) -> None:
    now = 1_700_000_000.0
    assert ago(now - seconds, now) == text


def test_ago_of_an_unpersisted_fragment_is_blank() -> None:
    assert ago(0) == ""


def _record(msg: str, level: int = logging.INFO, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("gazette.gazctl", level, __file__, 1, msg, (), None)
    record.fields = fields
    record.created = 1000.0 + 3.7
    return record


def test_text_log_lines_are_the_tutorials() -> None:
    fmt = TextFormatter(started=1000.0)
    assert fmt.format(_record("successfully applied", revision=8)) == \
        "INFO[0003] successfully applied revision=8"
    line = fmt.format(_record("read is ready", logging.DEBUG, **{
        "fragment.Begin": 14, "fragment.End": 41215, "fragment.URL": ""},
        journal="example/journal", offset=41172))
    assert line == ("DEBU[0003] read is ready fragment.Begin=14 fragment.End=41215 "
                    "fragment.URL= journal=example/journal offset=41172")
    warning = fmt.format(_record("x", logging.WARNING, selector="a b"))
    assert warning == 'WARN[0003] x selector="a b"'


def test_json_log_lines() -> None:
    out = json.loads(JsonFormatter().format(_record("successfully applied", revision=8)))
    assert out["level"] == "info" and out["msg"] == "successfully applied"
    assert out["revision"] == 8 and out["time"].endswith("Z")


def test_progress_bar_only_on_a_terminal() -> None:
    stream = io.StringIO()
    bar = Progress(4, "journals", stream)
    bar.update(2, "example/journal")
    bar.clear()
    assert stream.getvalue() == ""  # StringIO is no terminal

    bar = Progress(4, "journals", stream, enabled=True)
    bar.update(2, "example/journal")
    assert stream.getvalue() == "\r[###############...............] 2/4 journals  example/journal"
    bar.clear()
    assert stream.getvalue().endswith("\r")
    assert Progress(0, "journals").render() == "[" + "#" * 30 + "] 0/0 journals"


def test_progress_steps_name_what_was_done_and_clear_the_line() -> None:
    stream = io.StringIO()
    bar = Progress(3, "journals listed", stream, enabled=True)
    bar.update(0)
    bar.step("foobar/part-000")
    bar.step("a/b")
    assert bar.done == 2
    last = "[" + "#" * 20 + "." * 10 + "] 2/3 journals listed  a/b"
    assert stream.getvalue().split("\r") == [
        "",
        "[" + "." * 30 + "] 0/3 journals listed",
        "[" + "#" * 10 + "." * 20 + "] 1/3 journals listed  foobar/part-000",
        last + " " * 12,  # shorter than the line before: padded over it
    ]
    bar.clear()
    assert stream.getvalue().endswith(last + " " * 12 + "\r" + " " * len(last) + "\r")

    quiet = io.StringIO()  # not a terminal: it counts, and writes nothing
    bar = Progress(3, "journals listed", quiet)
    bar.step("a/b")
    bar.clear()
    assert bar.done == 1 and quiet.getvalue() == ""


def _listed(name: str, route: Route | None = None) -> ListedJournal:
    spec = JournalSpec.from_dict({"name": name, "labels": [{"name": "my-label"},
                                                          {"name": "region", "value": "a"},
                                                          {"name": "region", "value": "b"}],
                                  "fragment": {"stores": ["file:///"]}})
    return ListedJournal(spec, 7, 5, route or Route())


def test_journals_table_columns() -> None:
    route = Route((ProcessId("local", "busy-walrus"), ProcessId("local", "other")), 0,
                  ("http://a:1", "http://b:2"))
    out = journals_table([_listed("example/journal", route), _listed("foobar/part-000")],
                         primary=True, replicas=True, rf=True, stores=True,
                         labels=["region"])
    lines = out.splitlines()
    assert lines[1].split("|")[1:-1] == [
        "      NAME       ", " RF ", "   PRIMARY   ", " REPLICAS ", "  STORES  ", " REGION "]
    assert [c.strip() for c in lines[3].split("|")[1:-1]] == [
        "example/journal", "3", "busy-walrus", "other", "file:///", "a,b"]
    # No broker serves it: blank primary and replicas.
    assert [c.strip() for c in lines[4].split("|")[1:-1]] == [
        "foobar/part-000", "3", "", "", "file:///", "a,b"]


def test_journal_json() -> None:
    route = Route((ProcessId("local", "busy-walrus"),), 0, ("http://a:1",))
    out = journal_to_dict(_listed("example/journal", route))
    assert out["name"] == "example/journal" and out["spec"]["name"] == "example/journal"
    assert out["mod_revision"] == 7 and out["create_revision"] == 5
    assert out["route"] == {"members": [{"zone": "local", "suffix": "busy-walrus"}],
                            "primary": 0, "endpoints": ["http://a:1"]}
    json.dumps(out)


def _info(begin: int, end: int, mod_time: int = 0, url: str = "") -> FragmentInfo:
    return FragmentInfo(Fragment("example/journal", begin, end, SHA1, CompressionCodec.SNAPPY,
                                 "file:///" if mod_time else "", mod_time), url)


def test_fragments_table_is_the_tutorials() -> None:
    now = 1_700_000_000
    out = fragments_table([_info(0, 43, now - 8 * 60), _info(43, 2365, now - 7 * 60),
                           _info(20296, 22246)], now=now)
    assert out == """\
+-----------------+--------+---------+---------------+-----------------+-------------+
|     JOURNAL     | OFFSET | LENGTH  |   PERSISTED   |      SHA1       | COMPRESSION |
+-----------------+--------+---------+---------------+-----------------+-------------+
| example/journal |      0 | 43 B    | 8 minutes ago | 92a7ee0e4be7... | SNAPPY      |
| example/journal |     43 | 2.3 KiB | 7 minutes ago | 92a7ee0e4be7... | SNAPPY      |
| example/journal |  20296 | 1.9 KiB |               | 92a7ee0e4be7... | SNAPPY      |
+-----------------+--------+---------+---------------+-----------------+-------------+"""
    with_urls = fragments_table([_info(0, 43, now, "https://s3/x?sig")], urls=True, now=now)
    assert "URL" in with_urls.splitlines()[1] and "https://s3/x?sig" in with_urls


def test_fragment_json_has_the_full_sha1() -> None:
    out = fragment_to_dict(_info(0, 43, 1_700_000_000, "file:///x"))
    assert out == {"journal": "example/journal", "begin": 0, "end": 43, "sha1": SHA1.hex(),
                   "compression_codec": "SNAPPY", "backing_store": "file:///",
                   "mod_time": 1_700_000_000, "path_postfix": "",
                   "path": "example/journal/0000000000000000-000000000000002b-"
                           f"{SHA1.hex()}.sz", "signed_url": "file:///x", "persist_error": ""}


def test_prune_summary() -> None:
    stats = PruneStats(journals=1, fragments=3, pruned=2, pruned_bytes=2048, total_bytes=3072)
    assert stats.summary(True) == ("would prune 2 fragments (2.0 KiB) of 1 journal; "
                                   "1 fragment (1.0 KiB) kept")
    stats.missing, stats.missing_bytes = 1, 1024
    assert stats.summary(False) == ("pruned 2 fragments (2.0 KiB) of 1 journal; 1 fragment "
                                    "not found in their stores; 0 fragments (0 B) kept")


def test_labels_without_values_are_blank_cells() -> None:
    spec = JournalSpec("a/b", labels=LabelSet([("my-label", "")]))
    out = journals_table([ListedJournal(spec, 1, 1, Route())], labels=["my-label", "none"])
    assert [c.strip() for c in out.splitlines()[3].split("|")[1:-1]] == ["a/b", "", ""]
