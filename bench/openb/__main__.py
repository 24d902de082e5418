"""`python -m bench.openb`: see bench/openb/__init__.py."""

from bench.openb import main

raise SystemExit(main())
