"""``python -m gazette_dev``: the ``gazette`` command (``dev up``, and ``serve``)."""

import contextlib
import sys

from gazette_dev.cli import main

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
