"""gazctl's settings: the broker and consumer addresses' sources, flag values and the
command line."""

from __future__ import annotations

import argparse
import io
from datetime import timedelta
from pathlib import Path

import pytest

from gazette.gazctl.__main__ import build_parser, run
from gazette.gazctl.config import (
    DEFAULT_ADDRESS,
    DEFAULT_CONSUMER_ADDRESS,
    Address,
    UsageError,
    broker_address,
    consumer_address,
    duration_arg,
    journal_arg,
    offset_arg,
    parse_time,
    selector_arg,
    time_arg,
)
from gazette.labels import Selector


def _ini(home: Path, text: str) -> None:
    path = home / ".config" / "gazette" / "gazctl.ini"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_tutorials_ini(tmp_path: Path) -> None:
    _ini(tmp_path, "[journals.Broker]\nAddress = http://localhost:9999\n")
    found = broker_address(None, {"HOME": str(tmp_path)})
    assert found.address == "http://localhost:9999"
    assert "gazctl.ini [journals.Broker]" in found.source


@pytest.mark.parametrize("section", ["journals", "Broker"])
def test_other_ini_sections(tmp_path: Path, section: str) -> None:
    _ini(tmp_path, f"[{section}]\naddress = broker:1\n")
    assert broker_address(None, {"HOME": str(tmp_path)}).address == "broker:1"


def test_precedence_flag_env_ini_default(tmp_path: Path) -> None:
    _ini(tmp_path, "[journals.Broker]\nAddress = http://ini:1\n")
    env = {"HOME": str(tmp_path), "BROKER_ADDRESS": "env:2"}
    assert broker_address("flag:3", env).address == "flag:3"
    assert broker_address(None, env).address == "env:2"
    assert broker_address(None, {"HOME": str(tmp_path)}).address == "http://ini:1"
    assert broker_address(None, {"HOME": str(tmp_path / "nobody")}).address == DEFAULT_ADDRESS
    assert broker_address(None, {"HOME": str(tmp_path), "BROKER_ADDRESS": ""}).address \
        == "http://ini:1"


def test_bad_addresses_and_ini_files_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"from \$BROKER_ADDRESS: .*scheme 'ftp'"):
        broker_address(None, {"BROKER_ADDRESS": "ftp://x:1"})
    _ini(tmp_path, "Address = no section\n")
    with pytest.raises(UsageError, match=r"gazctl.ini: not a valid INI file"):
        broker_address(None, {"HOME": str(tmp_path)})


def test_consumer_address_precedence_flag_env_ini_default(tmp_path: Path) -> None:
    _ini(tmp_path, "[journals.Broker]\nAddress = broker:1\n"
                   "[shards.Consumer]\nAddress = http://ini:1\n")
    env = {"HOME": str(tmp_path), "CONSUMER_ADDRESS": "env:2"}
    assert consumer_address("flag:3", env) == Address("flag:3", "--consumer.address")
    assert consumer_address(None, env).address == "env:2"
    found = consumer_address(None, {"HOME": str(tmp_path)})
    assert found.address == "http://ini:1" and "gazctl.ini [shards.Consumer]" in found.source
    assert consumer_address(None, {"HOME": str(tmp_path / "nobody")}).address == \
        DEFAULT_CONSUMER_ADDRESS == "localhost:8090"
    with pytest.raises(UsageError, match=r"consumer address from \$CONSUMER_ADDRESS: "):
        consumer_address(None, {"CONSUMER_ADDRESS": "nope"})


def test_flag_value_types() -> None:
    assert selector_arg("prefix=foobar/, name not in (foobar/part-001)") == \
        Selector.parse("prefix=foobar/, name not in (foobar/part-001)")
    assert selector_arg("") == Selector()
    with pytest.raises(argparse.ArgumentTypeError, match="bad selector"):
        selector_arg("name in (")
    assert journal_arg("example/journal") == "example/journal"
    with pytest.raises(argparse.ArgumentTypeError, match="bad journal name"):
        journal_arg("/abs")
    assert duration_arg("24h") == timedelta(hours=24)
    with pytest.raises(argparse.ArgumentTypeError):
        duration_arg("soon")
    assert offset_arg("42") == 42
    for bad in ("-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            offset_arg(bad)


def test_times() -> None:
    now = 1_700_000_000.0
    assert parse_time("1699990000", now) == 1_699_990_000
    assert parse_time("1h", now) == now - 3600
    assert parse_time("90m ago", now) == now - 5400
    assert parse_time("2023-11-14T22:13:20Z", now) == 1_700_000_000
    assert parse_time("2023-11-14T23:13:20+01:00", now) == 1_700_000_000
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday", now)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_global_flags_anywhere() -> None:
    for argv in (["--broker", "b:1", "--log.level=debug", "journals", "list"],
                 ["journals", "--broker", "b:1", "--log.level", "debug", "list"],
                 ["journals", "list", "--broker=b:1", "--log.level=debug"]):
        args = parse(*argv)
        assert (args.broker, args.log_level, args.verb) == ("b:1", "debug", "list")
    args = parse("journals", "list")
    assert not hasattr(args, "broker") and not hasattr(args, "log_level")
    assert parse("journals", "list", "--broker.address", "b:2").broker == "b:2"


def test_verbs_and_their_flags() -> None:
    args = parse("journals", "list", "-l", "my-label", "--primary", "-r", "-L", "a", "-L", "b",
                 "--format", "yaml")
    assert args.selector == Selector.parse("my-label") and args.primary and args.replicas
    assert args.label_columns == ["a", "b"] and args.format == "yaml"
    assert parse("journals", "list").selector == Selector()
    assert parse("journals", "apply").file == "-"
    assert parse("journals", "apply", "-f", "x.yaml", "--dry-run").file == "x.yaml"
    assert parse("journals", "apply", "--specs", "y.yaml").file == "y.yaml"
    args = parse("journals", "append", "-l", "name=example/journal", "--framing=lines")
    assert args.journal is None and args.framing == "lines" and args.input == "-"
    assert parse("journals", "append", "example/journal").framing == "lines"
    args = parse("journals", "read", "-l", "name=example/journal", "--tail", "--block")
    assert args.tail and args.block and args.offset == 0 and not args.direct
    args = parse("journals", "fragments", "-l", "x", "--url", "--from", "100", "--to", "200")
    assert (args.url, args.from_, args.to) == (True, 100, 200)
    assert args.signature_ttl == timedelta(hours=24) and args.url_ttl is None
    assert parse("journals", "fragments", "--url-ttl", "1m").url_ttl == timedelta(minutes=1)
    args = parse("journals", "prune", "-l", "x", "--dry-run", "--file-root", "/srv")
    assert args.dry_run and args.file_root == "/srv"
    assert parse("journals", "edit", "-l", "x").selector == Selector.parse("x")


def _run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    code = run(list(argv), stdin=io.BytesIO(), stdout=io.BytesIO(), stderr=err, env={})
    return code, err.getvalue()


@pytest.mark.parametrize("argv", [
    ["journals", "list", "-l", "name in ("],
    ["journals", "list", "--format", "xml"],
    ["journals", "read"],  # -l is required
    ["journals", "edit"],
    ["journals", "prune"],
    ["journals", "bogus"],
    ["shards", "bogus"],  # gazctl shards exists; an unknown verb of it does not
    ["journals", "list", "--no-such-flag"],
    ["journals", "read", "-l", "x", "--offset", "-5"],
])
def test_usage_errors_exit_2_with_one_line(argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = _run(*argv)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(("argv", "message"), [
    (["journals", "append"], "give the JOURNAL to append to, or -l SELECTOR"),
    (["journals", "append", "a/b", "-l", "x"], "not both"),
    (["journals", "read", "-l", "x", "--tail", "--offset", "5"], "exclude each other"),
    (["--broker", "ftp://x:1", "journals", "list"], "scheme 'ftp'"),
])
def test_checked_combinations_exit_2(argv: list[str], message: str) -> None:
    code, err = _run(*argv)
    assert code == 2 and message in err and err.startswith("gazctl: ")


def test_no_verb_prints_help_and_exits_2() -> None:
    code, err = _run()
    assert code == 2 and "journals" in err
    code, err = _run("journals")
    assert code == 2 and "append" in err and "prune" in err


def test_bad_log_env_is_a_usage_error() -> None:
    err = io.StringIO()
    code = run(["journals", "list"], stdout=io.BytesIO(), stderr=err, env={"LOG_LEVEL": "loud"})
    assert code == 2 and "$LOG_LEVEL='loud'" in err.getvalue()


def test_offsets_are_bounded_by_int64() -> None:
    assert offset_arg(str(2**63 - 1)) == 2**63 - 1
    assert offset_arg("0") == 0
    with pytest.raises(argparse.ArgumentTypeError) as err:
        offset_arg("99999999999999999999999")
    assert str(err.value) == "must be at most 9223372036854775807, got 99999999999999999999999"
    with pytest.raises(argparse.ArgumentTypeError, match=r"at most .*, got a 5000-digit number"):
        offset_arg("9" * 5000)  # too long for int(): still one short line
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at least 0 .*--tail"):
        offset_arg("-1")
    for bad in ("1_000", "0x10", "1e3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a byte offset"):
            offset_arg(bad)


def test_integer_flags_are_bounded() -> None:
    assert parse("journals", "apply").max_txn_size == 128
    assert parse("journals", "edit", "-l", "x", "--max-txn-size", "5").max_txn_size == 5
    assert parse("journals", "append", "a/b").max_record_size == 256 << 20
    assert parse("journals", "append", "a/b", "--max-record-size", "10").max_record_size == 10
    assert parse("journals", "fragments", "--from", str(2**63 - 1)).from_ == 2**63 - 1
    with pytest.raises(argparse.ArgumentTypeError, match=r"at most 9223372036854775807"):
        time_arg("99999999999999999999")
    with pytest.raises(argparse.ArgumentTypeError, match=r"before 1970"):
        time_arg("0001-01-01T00:00:00Z")
    with pytest.raises(argparse.ArgumentTypeError, match=r"longer than 100 years"):
        time_arg("9999999999h")


@pytest.mark.parametrize(("argv", "message"), [
    (["journals", "read", "-l", "x", "--offset", "99999999999999999999999"],
     "argument --offset: must be at most 9223372036854775807, got 99999999999999999999999"),
    (["journals", "apply", "--max-txn-size", "129"],
     "argument --max-txn-size: must be at most 128 (etcd's limit of operations in one "
     "transaction), got 129"),
    (["journals", "apply", "--max-txn-size", "0"], "argument --max-txn-size: must be at least 1"),
    (["journals", "edit", "-l", "x", "--max-txn-size", "99999999999999999999999"],
     "argument --max-txn-size: must be at most 128"),
    (["journals", "append", "a/b", "--max-record-size", "0"],
     "argument --max-record-size: must be at least 1"),
    (["journals", "append", "a/b", "--max-record-size", str(2**63)],
     "argument --max-record-size: must be at most 9223372036854775807"),
    (["journals", "fragments", "--from", "99999999999999999999"],
     "argument --from: must be at most 9223372036854775807"),
    (["journals", "fragments", "--to", "1900-01-01T00:00:00Z"], "argument --to: "),
])
def test_integer_overflows_are_usage_errors(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = _run(*argv)
    err = capsys.readouterr().err  # argparse's errors go to the process's stderr
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert _run("--version") == (0, "")
    assert capsys.readouterr().out == f"gazctl {version('gazette-py')}\n"
