"""Serve plotly.js from the installed `plotly` package as a static file of the portal.

The portal draws its charts with the plotly.js that the `plotly` Python package ships
(plotly/package_data/plotly.min.js), never a CDN: the charts work on a cluster without internet
access, and the script always matches the package that builds the figures. This finder makes
that one file a static file at `vendor/plotly/plotly.min.js`, so `runserver` and whitenoise's
finders (`make run`, tests) serve it and `collectstatic` copies it for production, without a
4 MB copy in the repository.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

from django.contrib.staticfiles.finders import BaseFinder
from django.core.checks import CheckMessage, Error
from django.core.files.storage import FileSystemStorage

PREFIX = "vendor/plotly"
NAME = "plotly.min.js"
PATH = f"{PREFIX}/{NAME}"


def _location() -> Path:
    return Path(str(files("plotly") / "package_data"))


class PlotlyFinder(BaseFinder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=_location())
        # collectstatic and whitenoise put a storage's files under its `prefix`.
        self.storage.prefix = PREFIX  # type: ignore[attr-defined]

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        if not (_location() / NAME).is_file():
            return [Error(f"{_location() / NAME} is missing: reinstall plotly.", id="portal.E001")]
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> Any:
        found = str(_location() / NAME) if path == PATH else None
        if find_all:
            return [found] if found else []
        return found

    def list(self, ignore_patterns: Any) -> Iterator[tuple[str, FileSystemStorage]]:
        yield NAME, self.storage
