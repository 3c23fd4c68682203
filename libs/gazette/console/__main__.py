"""``python -m gazette.console [flags]``: as ``gazette console``."""

import contextlib
import sys

from gazette.console.cli import main

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
