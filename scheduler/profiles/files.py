"""Scheduling profile files: read, validate, and watch for changes.

The engine validates a dict (`Profile.from_document`); this module does the I/O around it:
reading the file, parsing YAML strictly (a key given twice is an error, not the last one
winning), and telling the daemon when the file changed. No Django here: the benchmarks load
their profiles through `read_profile` too.

`ProfileWatch.refresh()` is called by the daemon before each cycle. It looks at the file
(its size and modification time, at most every `every_s`) and reads it again only when they
changed; a new content that validates replaces the profile in force and is announced to
`on_loaded`, a bad one is logged (once per content) and announced to `on_refused`, and the
profile in force stays.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scheduler.core import Profile, ProfileError

log = logging.getLogger("gantry.profile")

BUILT_IN = "(built-in defaults)"


@dataclass(frozen=True)
class LoadedProfile:
    """A profile and where it came from: `path` is None for the built-in defaults."""

    profile: Profile
    path: str | None
    sha256: str

    @property
    def source(self) -> str:
        return self.path or BUILT_IN

    def describe(self) -> str:
        """One line for logs and benchmark output."""
        return f"profile {self.profile.name!r} from {self.source} (sha256 {self.sha256[:12]})"


def built_in() -> LoadedProfile:
    profile = Profile()
    return LoadedProfile(profile, None, _digest(yaml.safe_dump(profile.to_document()).encode()))


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool | None):
            continue  # construct_mapping refuses an unhashable key with its own error
        if key in seen:
            raise ProfileError([(str(key), f"given twice (line {key_node.start_mark.line + 1})")])
        seen.add(key)
    return dict(loader.construct_mapping(node, deep=True))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse_profile(text: bytes) -> Profile:
    """A profile file's content to a Profile; ProfileError naming every problem."""
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        problem = getattr(error, "problem", None) or str(error)
        raise ProfileError([(where, f"not valid YAML: {problem}")]) from error
    return Profile.from_document(document)


def read_profile(path: str | os.PathLike[str]) -> LoadedProfile:
    """Read and validate a profile file. OSError when it cannot be read, ProfileError when
    it is not a valid profile."""
    text = Path(path).read_bytes()
    return LoadedProfile(parse_profile(text), str(path), _digest(text))


def _digest(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


class ProfileWatch:
    """The profile in force for a daemon, reloaded when its file changes.

    `on_loaded(loaded)` is called with the first profile, with every change, and again when
    `refresh` gets a new `lead` (a new leadership's epoch); `on_refused(path, sha256, errors)`
    with each bad new content of the file, once. Either may raise (a database error): what
    was announced is remembered only when the call returned, so the next `refresh` announces
    it again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        on_loaded: Callable[[LoadedProfile], object] | None = None,
        on_refused: Callable[[str, str, list[tuple[str, str]]], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = 1.0,
    ) -> None:
        self.path = None if path is None else str(path)
        self.on_loaded, self.on_refused = on_loaded, on_refused
        self.clock, self.every_s = clock, every_s
        # the first read raises: a daemon does not start on a bad or missing file
        self.current = built_in() if self.path is None else read_profile(self.path)
        self._stat = self._stat_now()
        self._checked_at = clock()
        self._announced: LoadedProfile | None = None
        self._lead: object = None
        self._refused: str | None = None  # sha256 of the last bad content announced

    @property
    def profile(self) -> Profile:
        return self.current.profile

    def refresh(self, *, lead: object = None) -> Profile:
        """The profile to run this cycle. A `lead` other than the last one's announces the
        profile in force again, changed or not: a new leader records what it runs."""
        if lead != self._lead or self._announced is None:
            self._announce(lead)  # first, so that a refusal below has a record to join
        if self.path is not None and self.clock() - self._checked_at >= self.every_s:
            self._checked_at = self.clock()
            self._check_file(self.path)
        if self._announced is not self.current:
            self._announce(lead)
        return self.current.profile

    def _announce(self, lead: object) -> None:
        if self.on_loaded is not None:
            self.on_loaded(self.current)
        self._announced, self._lead = self.current, lead

    def _stat_now(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _check_file(self, path: str) -> None:
        stat = self._stat_now()
        if stat == self._stat:
            return
        self._stat = stat
        try:
            text = Path(path).read_bytes()
        except OSError as error:
            self._refuse(path, "", [("(file)", f"cannot be read: {error.strerror or error}")])
            return
        sha = _digest(text)
        if sha == self.current.sha256:
            return  # touched, not changed
        try:
            profile = parse_profile(text)
        except ProfileError as error:
            self._refuse(path, sha, list(error.errors))
            return
        previous = self.current
        self.current = LoadedProfile(profile, path, sha)
        self._refused = None
        log.info("%s replaces %s", self.current.describe(), previous.describe())

    def _refuse(self, path: str, sha: str, errors: list[tuple[str, str]]) -> None:
        if self._refused == (sha or "unreadable"):
            return
        log.error(
            "profile file %s refused, keeping %s: %s",
            path,
            self.current.describe(),
            "; ".join(f"{where}: {message}" for where, message in errors),
        )
        if self.on_refused is not None:
            self.on_refused(path, sha, errors)
        self._refused = sha or "unreadable"
