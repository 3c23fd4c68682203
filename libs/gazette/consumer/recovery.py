"""A shard's store rebuilt from its recovery log, and the log's hints in etcd.

A shard with a `recovery_log_prefix` keeps its store in a local folder (under the
member's `local_dir`) that its recovery log replicates. Before it runs as primary, its
member plays the log into a fresh folder and takes the log over (`Player.handoff`),
which fences out any earlier primary; the store is then opened on that folder
(`Shard.folder`). Playback starts from the newest hints in etcd that work: the primary
hints (``<hint_prefix>/<id>.primary``), then each backup (``.backup.1`` ...), falling
back when one fails (a fragment pruned, a hint past the log's end); with no hints at
all, from the log's start.

Hints are written by the primary every `HINTS_INTERVAL` seconds (after a commit) and
when the shard stops here; on each recovery the hints it started from become
``.backup.1`` (older backups shift down) and the new primary's, ``.primary``. Hints
only ever describe committed log content, so older ones stay valid (they just play
more); pruning keeps every fragment that any of them needs.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter

from gazette.client import JournalClient
from gazette.errors import GazetteError, ValidationError
from gazette.keyspace import Etcd, Txn
from gazette.protocol import ShardSpec
from gazette.recoverylog import Hints, PlaybackError, Player, Progress, RecordedFolder

log = logging.getLogger(__name__)

#: Seconds between writes of a primary's hints, and that a write may take.
HINTS_INTERVAL, HINTS_TIMEOUT = 30.0, 10.0

HINT_WRITES = Counter("gazette_consumer_hint_writes_total",
                      "Recovery-log hints written to etcd", ["result"])
HINT_FALLBACKS = Counter("gazette_consumer_hint_fallbacks_total",
                         "Recoveries that fell back from hints that failed to older ones")


def shard_folder(local_dir: Path, shard: str) -> Path:
    """The local folder of `shard`'s store (one path segment per shard)."""
    return local_dir / urllib.parse.quote(shard, safe="")


def new_author() -> int:
    """A recorder's author id: random, never 0."""
    return secrets.randbits(32) or 1


async def load_hints(etcd: Etcd, spec: ShardSpec) -> list[tuple[str, Hints | None]]:
    """Each hint key of the shard (primary, then backups) with its hints (None: absent
    or unusable, which is logged)."""
    log_name = spec.recovery_log
    out: list[tuple[str, Hints | None]] = []
    for key in spec.hint_keys:
        _, kv = await etcd.get(key)
        hints = None
        if kv is not None and kv.value:
            try:
                hints = Hints.decode(kv.value, key)
                if hints.log != log_name:
                    raise ValidationError(f"{key}.log", f"names log {hints.log}, not the "
                                          f"shard's {log_name}")
            except ValidationError as err:
                log.warning("shard %s: ignoring hints: %s", spec.id, err)
                hints = None
        out.append((key, hints))
    return out


async def store_hints(etcd: Etcd, spec: ShardSpec, hints: Hints, *,
                      rotate_from: list[tuple[str, Hints | None]] | None = None) -> None:
    """Write `hints` as the shard's primary hints; with `rotate_from` (the keys as
    loaded), the old primary becomes backup 1 and each backup moves down one."""
    keys = spec.hint_keys
    txn = Txn().put(keys[0], hints.encode())
    if rotate_from is not None:
        older = [h for _, h in rotate_from]
        for key, previous in zip(keys[1:], older, strict=False):
            if previous is not None:
                txn.put(key, previous.encode())
    try:
        await txn.commit(etcd)
    except BaseException:
        HINT_WRITES.labels("error").inc()
        raise
    HINT_WRITES.labels("ok").inc()


@dataclass
class Recovery:
    """What a member gives its shards with recovery logs: etcd (for hints) and the
    local folder their stores live under."""

    etcd: Etcd
    local_dir: Path


async def recover(client: JournalClient, etcd: Etcd, spec: ShardSpec, root: Path,
                  on_progress: Callable[[Progress], None] | None = None,
                  standby: Player | None = None) -> RecordedFolder:
    """Play the shard's recovery log into `root` and take it over: the folder its
    store opens on, recording from here (its `hints` already stored in etcd). A hot
    standby's `standby` player (stopped tailing) hands off from where it is."""
    log_name = spec.recovery_log
    if log_name is None:
        raise GazetteError(f"shard {spec.id} has no recovery log")
    loaded = await load_hints(etcd, spec)
    candidates: list[tuple[str, Hints | None]] = [(k, h) for k, h in loaded
                                                  if h is not None]
    if not candidates:
        candidates = [("the log's start", None)]
    if standby is not None:
        candidates.insert(0, ("its hot standby's copy", None))
    failures: list[str] = []
    for where, hints in candidates:
        player = standby if standby is not None and not failures else \
            Player(client, log_name, root, hints, name=f"shard {spec.id}")
        player.on_progress = on_progress
        try:
            recorder = await player.handoff(new_author())
        except PlaybackError as err:
            await player.finish()
            failures.append(f"from {where}: {err}")
            HINT_FALLBACKS.inc()
            log.warning("shard %s: playback from %s failed (%s)%s", spec.id, where, err,
                        "; trying older hints" if len(failures) < len(candidates) else "")
            continue
        folder = RecordedFolder(root, recorder)
        folder.hints = recorder.hints()
        await store_hints(etcd, spec, folder.hints, rotate_from=loaded)
        log.info("shard %s: recovered from %s: %d bytes of %s played", spec.id, where,
                 player.progress.played, log_name)
        return folder
    raise PlaybackError(f"shard {spec.id}: no hints could rebuild its store: "
                        + "; ".join(failures))


class Standby:
    """A hot standby of a shard: plays its recovery log into the shard's folder and
    keeps tailing it, so that, made primary, it hands off with little left to play.
    `on_progress` is told of playback, `on_ready` once it has caught up."""

    def __init__(self, client: JournalClient, recovery: Recovery, spec: ShardSpec,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.client, self.recovery, self.spec = client, recovery, spec
        self.on_progress, self.on_ready = on_progress, on_ready
        self.player: Player | None = None
        self._stop = asyncio.Event()

    async def run(self) -> None:
        """Play, then tail until `stop()`; a failure is raised (the shard shows it)."""
        spec, log_name = self.spec, self.spec.recovery_log
        assert log_name is not None
        loaded = await load_hints(self.recovery.etcd, spec)
        hints = next((h for _, h in loaded if h is not None), None)
        player = Player(self.client, log_name,
                        shard_folder(self.recovery.local_dir, spec.id), hints,
                        name=f"shard {spec.id}")
        player.on_progress = self.on_progress
        await player.play()
        self.player = player
        if self.on_ready is not None:
            self.on_ready()
        await player.tail(self._stop)

    def stop(self) -> None:
        self._stop.set()

    async def discard(self) -> None:
        """It is not needed any more (stopped, not made primary): close its files and
        remove its folder."""
        if self.player is not None:
            await self.player.finish()
        await asyncio.to_thread(shutil.rmtree,
                                shard_folder(self.recovery.local_dir, self.spec.id), True)
