"""The installation's version: the one `pyproject.toml` declares, as the installed package
records it (importlib.metadata).

`make venv` installs the project again whenever `pyproject.toml` changes, so the recorded
version follows a bump; `tests/test_releases.py` fails when the two disagree. The CLI keeps
its own copy of this lookup (`cli/main.py`): it imports no server package.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "gantry"


@cache
def gantry_version() -> str:
    """The installed Gantry's version ("1.0.0"), or "unknown" when the tree runs without
    being installed (no package metadata to read)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"
