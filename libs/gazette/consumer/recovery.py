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
when the shard stops here; on each recovery the primary hints become ``.backup.1``
(older backups shift down) and the new primary's, ``.primary``. Hints only ever
describe committed log content, so older ones stay valid (they just play more); pruning
keeps every fragment that any of them needs. Yet stored hints never move backwards: a
write of hints taken earlier in the log than the stored ones (a fenced primary's last
hints, written after its successor's) is skipped.

Each incarnation of a shard on a member (a run as primary, a hot standby) plays into a
folder of its own (`Recovery.claim`): one left behind still running (its stop timed
out) never shares a folder with the next, nor removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import shutil
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter

from gazette.client import JournalClient
from gazette.errors import GazetteError, ValidationError
from gazette.keyspace import Etcd, KeyValue, Txn, TxnConflict
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


def _decoded(spec: ShardSpec, key: str, kv: KeyValue | None) -> Hints | None:
    """The hints stored at `key` (None: absent or unusable, which is logged)."""
    if kv is None or not kv.value:
        return None
    try:
        hints = Hints.decode(kv.value, key)
        if hints.log != spec.recovery_log:
            raise ValidationError(f"{key}.log", f"names log {hints.log}, not the "
                                  f"shard's {spec.recovery_log}")
    except ValidationError as err:
        log.warning("shard %s: ignoring hints: %s", spec.id, err)
        return None
    return hints


async def load_hints(etcd: Etcd, spec: ShardSpec) -> list[tuple[str, Hints | None]]:
    """Each hint key of the shard (primary, then backups) with its hints (None: absent
    or unusable, which is logged)."""
    return [(key, _decoded(spec, key, (await etcd.get(key))[1])) for key in spec.hint_keys]


#: Writes of hints that lost a race with another writer, at most, before giving up.
HINT_WRITE_ATTEMPTS = 8


async def store_hints(etcd: Etcd, spec: ShardSpec, hints: Hints, *,
                      rotate: bool = False, everywhere: bool = False) -> bool:
    """Write `hints` as the shard's primary hints, unless the stored ones were taken
    later in the log (then False: they stay). With `rotate`, the primary hints become
    backup 1 and each backup moves down one; with `everywhere`, the backups become
    `hints` too. Guarded by the keys' revisions, read anew when another writer got
    there first."""
    keys = spec.hint_keys if rotate or everywhere else spec.hint_keys[:1]
    for _ in range(HINT_WRITE_ATTEMPTS):
        kvs = [(await etcd.get(key))[1] for key in keys]
        usable = [_decoded(spec, key, kv) is not None for key, kv in zip(keys, kvs,
                                                                         strict=True)]
        stored = _decoded(spec, keys[0], kvs[0]) if usable[0] else None
        if stored is not None and stored.through > hints.through:
            HINT_WRITES.labels("stale").inc()
            log.info("shard %s: hints through operation %d not stored: etcd has hints "
                     "through %d", spec.id, hints.through, stored.through)
            return False
        txn = Txn()
        for key, kv in zip(keys, kvs, strict=True):
            txn.expect(key, kv.mod_revision if kv is not None else 0)
        txn.put(keys[0], hints.encode())
        for key, previous, ok in zip(keys[1:], kvs, usable, strict=False):
            if everywhere:
                txn.put(key, hints.encode())
            elif ok and previous is not None:
                txn.put(key, previous.value)
        try:
            await txn.commit(etcd)
        except TxnConflict:
            continue  # another writer's hints: compare with those
        except BaseException:
            HINT_WRITES.labels("error").inc()
            raise
        HINT_WRITES.labels("ok").inc()
        return True
    HINT_WRITES.labels("error").inc()
    raise GazetteError(f"shard {spec.id}: hints not stored: other writers changed them "
                       f"{HINT_WRITE_ATTEMPTS} times meanwhile")


@dataclass
class Recovery:
    """What a member gives its shards with recovery logs: etcd (for hints) and the
    local folder their stores live under."""

    etcd: Etcd
    local_dir: Path
    #: Folders held by incarnations of shards here (`claim`, `release`).
    _claimed: set[Path] = field(default_factory=set, init=False, repr=False)
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1),
                                           init=False, repr=False)

    def claim(self, shard: str) -> Path:
        """A folder for one incarnation of `shard` here (a run as primary, a hot
        standby), which no other incarnation plays into or removes until `release`."""
        while True:
            folder = shard_folder(self.local_dir, shard) / str(next(self._numbers))
            if folder not in self._claimed:
                self._claimed.add(folder)
                return folder

    async def release(self, folder: Path) -> None:
        """The incarnation is over: its folder is removed, and free for another."""
        try:
            await asyncio.to_thread(shutil.rmtree, folder, True)
            with contextlib.suppress(OSError):  # the shard's, once no incarnation's
                await asyncio.to_thread(folder.parent.rmdir)
        finally:
            self._claimed.discard(folder)


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
        # (Not stored if a later primary's are: this one is fenced out already.)
        await store_hints(etcd, spec, folder.hints, rotate=True)
        log.info("shard %s: recovered from %s: %d bytes of %s played", spec.id, where,
                 player.progress.played, log_name)
        return folder
    raise PlaybackError(f"shard {spec.id}: no hints could rebuild its store: "
                        + "; ".join(failures))


async def run_recovered(client: JournalClient, recovery: Recovery, spec: ShardSpec,
                        run: Callable[[RecordedFolder], Awaitable[None]],
                        on_progress: Callable[[Progress], None] | None = None,
                        standby: Player | None = None) -> None:
    """Recover the shard's store into a folder of this run's own (`recover`; a hot
    standby's, if it hands off from one: one left behind by an earlier run, still
    running, never touches it), then `run` on it while its hints are written to etcd
    (`keep_hints`), and its last hints once it ends; the folder is released after."""
    root = standby.root if standby is not None else recovery.claim(spec.id)
    try:
        folder = await recover(client, recovery.etcd, spec, root, on_progress, standby)
        try:
            async with asyncio.TaskGroup() as group:
                hints = group.create_task(keep_hints(recovery.etcd, spec, folder),
                                          name=f"hints:{spec.id}")
                await run(folder)
                hints.cancel()
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from failed
        finally:
            folder.recorder.detach()
            await store_last_hints(recovery.etcd, spec, folder)
    finally:
        await recovery.release(root)


async def keep_hints(etcd: Etcd, spec: ShardSpec, folder: RecordedFolder) -> None:
    """Write the store's hints to etcd every `HINTS_INTERVAL` (if they changed); a
    failed write is logged and tried again next time. Hints that start later in the log
    than the last written (the store rewrote its files: `SQLiteStore`) are written at
    once, and replace the backups too: older hints would keep the log's dead stretches
    from being pruned."""
    written = folder.hints
    while True:
        with contextlib.suppress(TimeoutError):  # (or at once, when they moved on)
            await asyncio.wait_for(folder.moved.wait(), HINTS_INTERVAL)
        folder.moved.clear()
        hints = folder.hints
        if hints is None or hints == written:
            continue
        moved = written is not None and hints.first_offset() > written.first_offset()
        try:
            async with asyncio.timeout(HINTS_TIMEOUT):
                await store_hints(etcd, spec, hints, everywhere=moved)
            written = hints
        except (GazetteError, TimeoutError) as err:  # etcd's, or writers racing
            log.warning("shard %s: writing hints failed (tried again in %.0f s): %s",
                        spec.id, HINTS_INTERVAL, err or "timed out")


async def store_last_hints(etcd: Etcd, spec: ShardSpec, folder: RecordedFolder) -> None:
    """The shard stops here: its last hints, so the next primary plays little."""
    if folder.hints is None:
        return
    try:
        async with asyncio.timeout(HINTS_TIMEOUT):
            await store_hints(etcd, spec, folder.hints)
    except Exception as err:  # noqa: BLE001 - best effort: older hints still work
        log.warning("shard %s: writing its last hints failed: %s", spec.id,
                    err or "timed out")


class Standby:
    """A hot standby of a shard: plays its recovery log into a folder of its own and
    keeps tailing it, so that, made primary, it hands off with little left to play.
    `on_progress` is told of playback, `on_ready` once it has caught up."""

    def __init__(self, client: JournalClient, recovery: Recovery, spec: ShardSpec,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_ready: Callable[[], None] | None = None) -> None:
        self.client, self.recovery, self.spec = client, recovery, spec
        self.on_progress, self.on_ready = on_progress, on_ready
        self.player: Player | None = None  # once it has caught up
        self._player: Player | None = None
        self.root = recovery.claim(spec.id)
        self._stop = asyncio.Event()
        self._released = False

    async def run(self) -> None:
        """Play, then tail until `stop()` (its player and folder then go to the primary
        that `stop` was called for); a failure is raised (the shard shows it), and a
        failed or cancelled standby gives up its folder itself, once its playback has
        stopped writing there."""
        spec, log_name = self.spec, self.spec.recovery_log
        assert log_name is not None
        try:
            loaded = await load_hints(self.recovery.etcd, spec)
            hints = next((h for _, h in loaded if h is not None), None)
            player = self._player = Player(self.client, log_name, self.root, hints,
                                           name=f"shard {spec.id}")
            player.on_progress = self.on_progress
            await player.play()
            self.player = player
            if self.on_ready is not None:
                self.on_ready()
            await player.tail(self._stop)
        except BaseException:
            await self.discard()
            raise

    def stop(self) -> None:
        self._stop.set()

    async def discard(self) -> None:
        """It is not needed any more (not made primary, its `run` over): close its files
        and give up its folder."""
        if self._released:
            return
        self._released = True
        if self._player is not None:
            await self._player.finish()
        await self.recovery.release(self.root)
