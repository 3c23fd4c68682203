"""``python -m gazette_consumer``: the ``gazette-consumer`` command."""

import contextlib
import sys

from gazette_consumer.cli import main

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
