"""The web console (``gazette console``): server-rendered pages of a cluster's journals
(labels, write heads, routes, fragments), a message browser (read committed or not,
paged by offset), shards (replica statuses, lag, recovery, checkpoints), members and
their assignments, and events groups' dead letters with replay. Read-only unless its
one bearer token allows more. See docs/console.md."""

from gazette.console.config import CONSOLE_OPTIONS, ConsoleConfig
from gazette.console.server import Console

__all__ = ["CONSOLE_OPTIONS", "Console", "ConsoleConfig"]
