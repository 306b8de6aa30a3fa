"""``python -m fold_guard``: the ``fold-guard`` command."""

import sys

from .cli import main

# Guarded so that importing this module (pytest's --doctest-modules does) runs nothing.
if __name__ == "__main__":
    sys.exit(main())
