"""``gazette-consumer serve`` (``python -m gazette_consumer serve``, the consumer image's
entrypoint): its flags, their environment fallbacks, and the errors a misconfigured pod
gets, each one line naming the flag and exit status 2, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gazette.consumer import Application
from gazette.errors import ValidationError
from gazette_consumer.cli import SERVE_OPTIONS, build_parser, load_app, main

ENV_VARS = ("CONSUMER_APP", "CONSUMER_MODULE", "ETCD_ADDRESS", "CONSUMER_ETCD_PREFIX",
            "BROKER_ADDRESS", "CONSUMER_PORT", "CONSUMER_ZONE", "CONSUMER_ID")


class Good(Application):
    """An application for these tests (``MODULE:ATTR`` names it)."""


good = Good()
not_an_app = 42


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_help_names_every_flag_and_variable() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    proc = subprocess.run([sys.executable, "-m", "gazette_consumer", "serve", "--help"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for option in SERVE_OPTIONS:
        assert option.flag in text and f"${option.env}" in text, option.flag
    assert "--app" in text and "$CONSUMER_MODULE" in text


class Unconfigured(Application):
    """An application class whose configuration (from the environment) is missing."""

    def __init__(self) -> None:
        raise ValidationError("SOME_SETTING", "is not set")


def test_a_missing_app_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["serve"], capsys)
    assert code == 2
    assert "--app is required" in err and "$CONSUMER_MODULE" in err


@pytest.mark.parametrize(("app", "says"), [
    ("no_such_module_xyz:app", "module 'no_such_module_xyz' does not import"),
    (f"{__name__}:missing", f"module '{__name__}' has no 'missing'"),
    (f"{__name__}:not_an_app", "'not_an_app' is a int, not a gazette.consumer.Application"),
    (f"{__name__}:Unconfigured", "SOME_SETTING: is not set"),
])
def test_a_bad_app_is_named(app: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["serve", "--app", app], capsys)
    assert code == 2
    assert says in err and err.count("\n") == 1, err


def test_an_app_is_an_instance_or_a_class() -> None:
    app, name = load_app(f"{__name__}:good")
    assert app is good and name == "test-consumer-entrypoint"
    app, _ = load_app(f"{__name__}:Good")
    assert isinstance(app, Good)


def test_a_bad_app_name_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["serve", "--app", f"{__name__}:good", "--app-name", "a#b"], capsys)
    assert code == 2
    assert "app" in err and "'a#b'" in err, err


def test_flags_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSUMER_MODULE", f"{__name__}:good")
    monkeypatch.setenv("CONSUMER_APP", "counter")
    monkeypatch.setenv("CONSUMER_ETCD_PREFIX", "/dev/consumers")
    monkeypatch.setenv("ETCD_ADDRESS", "http://etcd:2379")
    monkeypatch.setenv("BROKER_ADDRESS", "broker:8080")
    monkeypatch.setenv("CONSUMER_PORT", "9000")
    args = build_parser().parse_args(["serve"])
    assert (args.app, args.app_name, args.etcd_root, args.etcd_address,
            args.broker_address, args.port) == (
        f"{__name__}:good", "counter", "/dev/consumers", "http://etcd:2379",
        "broker:8080", 9000)


def test_a_bad_environment_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSUMER_PORT", "eighty")
    with pytest.raises(SystemExit, match=r"\$CONSUMER_PORT='eighty' is not a valid int"):
        build_parser()


def test_an_app_beside_the_caller_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """The console script has no working directory on its path (``python -m`` has):
    an application module in the directory the command runs from imports all the
    same."""
    (tmp_path / "beside_app.py").write_text(
        "from gazette.consumer import Application\n\n\nclass App(Application):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    app, name = load_app("beside_app:App")
    assert type(app).__name__ == "App" and name == "beside-app"
