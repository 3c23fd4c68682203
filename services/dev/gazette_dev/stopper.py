"""How ``gazette dev up`` stops: on Ctrl-C, SIGTERM, or its terminal closing (SIGHUP).

The first signal stops in order: the consumer member, then each broker drained and
persisted, then etcd, and the temporary folder is removed. A second signal (a drain that
takes long: etcd frozen, say) stops at once: etcd is killed, the temporary folder
removed, and the process exits 128 + the signal, the brokers not drained. After a
hang-up the terminal is gone: output that went to it goes nowhere from then on (a write
to it would fail, and stop the cleanup half-way).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import NoReturn

from gazette.local import EmbeddedEtcd

#: Signals that stop ``dev up``.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopper:
    """The state of a stop: which signal asked for it, and what a stop at once cleans up
    (etcd, the temporary folder)."""

    def __init__(self) -> None:
        self.signum = 0
        self.etcd: EmbeddedEtcd | None = None
        self.temp_dir: Path | None = None
        self._ttys = [fd for fd in (0, 1, 2) if _isatty(fd)]

    @property
    def signalled(self) -> bool:
        return self.signum != 0

    def install(self) -> None:
        """Handle the stop signals outside the event loop (starting etcd, stopping
        it): the first raises KeyboardInterrupt, so what started is stopped on the way
        out; a second stops at once. Also after a loop is closed (closing it restores
        the default handlers, which would end the process on the spot)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._outside_loop)

    def _outside_loop(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled:
            self.at_once(signum)
        self.first(signum)
        raise KeyboardInterrupt

    def in_loop(self, loop: asyncio.AbstractEventLoop, on_first: Callable[[], None]
                ) -> None:
        """Handle them on `loop`: the first calls `on_first`; a second stops at once."""
        def first(signum: int) -> None:
            self.first(signum)
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self.at_once, sig)
            on_first()

        for sig in STOP_SIGNALS:
            if self.signalled:
                loop.add_signal_handler(sig, self.at_once, sig)
            else:
                loop.add_signal_handler(sig, first, sig)

    def first(self, signum: int) -> None:
        self.signum = signum
        if signum == signal.SIGHUP:
            self.detach()

    def detach(self) -> None:
        """The terminal is gone: what was written to it goes to /dev/null."""
        if not self._ttys:
            return
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in self._ttys:
                os.dup2(null, fd)
        finally:
            os.close(null)
        self._ttys = []

    def at_once(self, signum: int) -> NoReturn:
        """Kill etcd, remove the temporary folder, exit 128 + `signum`."""
        if signum == signal.SIGHUP:
            self.detach()
        try:
            sys.stdout.flush()
            print(f"\n{signal.Signals(signum).name} again: stopping at once (etcd killed, "
                  "the brokers not drained).", file=sys.stderr, flush=True)
        except OSError:
            pass
        if self.etcd is not None:
            self.etcd.kill()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        os._exit(128 + signum)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False
