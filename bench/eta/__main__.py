"""`python -m bench.eta`: see bench/eta/__init__.py."""

from bench.eta import main

main()
