"""``python -m gazette_consumer``, the consumer image's entrypoint: its flags, their
environment fallbacks, and the errors a misconfigured pod gets (the runtime itself is not
there yet, so even a good configuration exits with status 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gazette_consumer.__main__ import NOT_IMPLEMENTED, main

ENV_VARS = ("CONSUMER_APP", "CONSUMER_MODULE", "ETCD_ADDRESS", "CONSUMER_ETCD_PREFIX")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        sys.exit(main(argv))
    code = exit_.value.code
    assert isinstance(code, int)
    return code, capsys.readouterr().err


def test_help_exits_0() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    proc = subprocess.run([sys.executable, "-m", "gazette_consumer", "--help"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--app", "--module", "--etcd.address", "--etcd.prefix",
                 "$CONSUMER_APP", "$CONSUMER_MODULE", "$ETCD_ADDRESS", "$CONSUMER_ETCD_PREFIX"):
        assert flag in proc.stdout


def test_missing_app_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["--module", "json"], capsys)
    assert code == 2
    assert "--app" in err and "$CONSUMER_APP" in err


def test_missing_module_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["--app", "wordcount"], capsys)
    assert code == 2
    assert "--module" in err and "$CONSUMER_MODULE" in err


def test_an_app_name_with_a_slash_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["--app", "a/b", "--module", "json"], capsys)
    assert code == 2
    assert "'a/b'" in err


def test_an_unknown_module_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["--app", "wordcount", "--module", "no_such_module_xyz.app"], capsys)
    assert code == 2
    assert "no_such_module_xyz.app" in err and "does not import" in err


def test_a_good_configuration_says_the_runtime_is_missing(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["--app", "wordcount", "--module", "json"], capsys)
    assert code == 2
    assert NOT_IMPLEMENTED in err
    assert "/gazette/consumers/wordcount" in err


def test_flags_fall_back_to_the_environment(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CONSUMER_APP", "counter")
    monkeypatch.setenv("CONSUMER_MODULE", "json")
    monkeypatch.setenv("CONSUMER_ETCD_PREFIX", "/dev/consumers/")
    monkeypatch.setenv("ETCD_ADDRESS", "http://etcd:2379")
    code, err = run([], capsys)
    assert code == 2
    assert NOT_IMPLEMENTED in err
    assert "/dev/consumers/counter" in err and "http://etcd:2379" in err
