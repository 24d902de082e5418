"""`python -m bench.load`: see bench/load/__init__.py."""

import sys

from bench.load import main

sys.exit(main())
