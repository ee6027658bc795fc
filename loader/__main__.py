"""``python -m loader``: the ``loader`` command (see ``loader.cli``)."""

import sys

from loader.cli import main

if __name__ == "__main__":
    sys.exit(main())
