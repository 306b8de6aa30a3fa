"""``python -m fold_guard``: the ``fold-guard`` command."""

import sys

from .cli import main

sys.exit(main())
