"""``python -m gazette.local``: the local cluster demo."""

import sys

from gazette.local.demo import main

if __name__ == "__main__":
    sys.exit(main())
