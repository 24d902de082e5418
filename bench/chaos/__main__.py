"""`python -m bench.chaos`: see bench/chaos/__init__.py."""

from bench.chaos import main

raise SystemExit(main())
