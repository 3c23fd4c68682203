"""Recovery logs: a store's local files made durable in a journal.

A `Recorder` sequences the store's file operations (create, write, truncate, link,
unlink) into the shard's recovery log, fenced by the log's `author` register so a
zombie primary cannot append after its successor took over; a `Player` rebuilds the
files in a fresh folder from `Hints` (which say where each live file's operations are,
so stretches of deleted files are skipped), then hands off to a new recorder (a
primary) or tails the log (a hot standby).
"""

from gazette.recoverylog.folder import RecordedFile, RecordedFolder
from gazette.recoverylog.fsm import FSM, Hints, InconsistentOp, OutOfSequence, Segment
from gazette.recoverylog.ops import CorruptLog, Kind, Op
from gazette.recoverylog.player import PlaybackError, Player, Progress
from gazette.recoverylog.recorder import Recorder, RecorderFenced

__all__ = [
    "FSM",
    "CorruptLog",
    "Hints",
    "InconsistentOp",
    "Kind",
    "Op",
    "OutOfSequence",
    "PlaybackError",
    "Player",
    "Progress",
    "RecordedFile",
    "RecordedFolder",
    "Recorder",
    "RecorderFenced",
    "Segment",
]
