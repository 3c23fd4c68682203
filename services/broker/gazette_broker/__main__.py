"""``python -m gazette_broker``: the ``gazette`` command."""

import sys

from gazette_broker.cli import main

if __name__ == "__main__":
    sys.exit(main())
