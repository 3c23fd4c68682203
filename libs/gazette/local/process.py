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
from typing import Any

from gazette.errors import GazetteError


class ComponentError(GazetteError):
    """A real component could not be found or started; the message says why."""


#: Ports `free_port` handed out in this process: never handed out twice, for the kernel
#: may offer a port just closed again (two brokers of one test were given the same port,
#: and one failed to start).
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that this process
    has not handed out before."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise ComponentError("no free TCP port on 127.0.0.1 that this process has not handed "
                         "out already")


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
        with open(self.log_path, "ab") as log:
            try:
                self.popen = subprocess.Popen(
                    self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=self.env, cwd=self.cwd, start_new_session=True, **self.popen_kwargs(),
                )
            except OSError as exc:
                raise ComponentError(f"{self.name}: cannot run {self.argv[0]}: {exc}") from exc

    def popen_kwargs(self) -> dict[str, Any]:
        """Extra `subprocess.Popen` arguments (e.g. ``user=``) for subclasses."""
        return {}

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

    #: The signal asking the process to shut down gracefully.
    stop_signal: int = signal.SIGTERM

    def stop(self, timeout: float = 10.0, sig: int | None = None) -> None:
        """Signal the process and wait; SIGKILL its group if it lingers."""
        if self.popen is None or self.popen.poll() is not None:
            return
        sig = self.stop_signal if sig is None else sig
        try:
            self.send_signal(sig)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout)
        self.after_stop(sig)

    def send_signal(self, sig: int) -> None:
        """Signal the whole process group (children too); subclasses may narrow it."""
        assert self.popen is not None
        os.killpg(self.popen.pid, sig)

    def after_stop(self, sig: int) -> None:
        """Clean-up once the process has exited, for subclasses."""

    def kill(self) -> None:
        """Stop at once, as a crash would."""
        self.stop(sig=signal.SIGKILL)
