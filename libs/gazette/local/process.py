"""Child processes of a local cluster: started in their own process group, waited on
until healthy under a deadline, and stopped by PID (SIGTERM, then SIGKILL).

A component that cannot start raises `ComponentError` with the reason and the tail of
its log, so whoever needed it (a demo, a test) fails with a message that says why.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gazette.errors import GazetteError


class ComponentError(GazetteError):
    """A real component could not be found or started; the message says why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


class Process:
    """A child process with its log file; stopped by PID, whole process group."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} is not running"
        return self.popen.pid

    def start(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            raise ComponentError(f"{self.name} is already running (pid {self.popen.pid})")
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.popen = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=self.cwd, start_new_session=True,
            )
        except OSError as exc:
            raise ComponentError(f"{self.name}: cannot run {self.argv[0]}: {exc}") from exc
        finally:
            log.close()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_until(self, healthy: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `healthy` until true; fail with the log if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise ComponentError(
                    f"{self.name} exited with {self.popen.returncode} before {what}; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}"
                )
            try:
                if healthy():
                    return
            except Exception:  # noqa: BLE001 - not healthy yet, poll again
                pass
            time.sleep(0.05)
        raise ComponentError(
            f"{self.name} was not {what} within {timeout:.0f}s; "
            f"log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """Signal the process group and wait; SIGKILL it if it lingers."""
        if self.popen is None or self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout)

    def kill(self) -> None:
        """Stop at once, as a crash would."""
        self.stop(sig=signal.SIGKILL)
