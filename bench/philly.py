"""Microsoft Philly's nodes in use, a real GPU cluster's history for bench.forecast.

Source: `framework/CES Service/data/philly_node_sequence.csv` of the public repository
S-Lab-System-Group/HeliosArtifact (the artifact of the SC '21 Helios paper; Philly is the
cluster of msr-fiddle/philly-traces): one row a minute from 2017-10-03 00:00 to 2017-12-15
18:42, `time,active,total`, `active` the nodes running jobs (the artifact plots it as the
running node number) out of `total` (420 most of the time). Bring it with the `fetch` tool
(`github:S-Lab-System-Group/HeliosArtifact`) and pass the returned git directory, or the CSV
itself, to `--philly`; nothing of it is kept in this repository.

Demand here is allocated nodes (nodes that ran a job), in node-hours a day: not GPUs (the file
does not say how many GPUs each node has; Philly's have 2 to 8) and not requested (jobs that
waited are not in it). A sample of 0 active nodes is a gap in the log, not an idle cluster (it
comes in one block of 18 hours on 2017-10-26, ended by five minutes of 1 to 7 nodes as the log
comes back, and two blocks of minutes; no other minute falls below 93 nodes); so is a missing
minute. A day's node-hours are 24 times the mean of its samples, over the whole days between
the log's first and last minutes.
"""

from __future__ import annotations

import csv
import io
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SOURCE = "github:S-Lab-System-Group/HeliosArtifact"
PATH_IN_REPO = "framework/CES Service/data/philly_node_sequence.csv"
DEFAULT_SOURCE = (
    Path(__file__).resolve().parents[2] / ".mirror" / "S-Lab-System-Group+HeliosArtifact" / "repo"
)
MINUTES_A_DAY = 1440


class HistoryMissing(Exception):
    """The history cannot be read; the message says why and where to get it."""


@dataclass(frozen=True)
class NodeHistory:
    node_hours: np.ndarray  # one value a whole day, from `first_day`
    first_day: str  # ISO date
    gap_minutes: int  # minutes missing or logged as 0 active nodes, within the days kept


def _csv_text(source: Path) -> str:
    """The CSV's text, from the file itself or from a git directory holding the artifact."""
    if source.is_file():
        return source.read_text()
    if not (source / "HEAD").is_file() and not (source / ".git").exists():
        raise HistoryMissing(
            f"{source} is neither the CSV nor a git directory; fetch {SOURCE} and pass"
            f" its git directory or {PATH_IN_REPO!r} to --philly"
        )
    try:
        shown = subprocess.run(  # noqa: S603 - git on a path the user named, read-only
            ["git", f"--git-dir={_git_dir(source)}", "show", f"HEAD:{PATH_IN_REPO}"],  # noqa: S607
            capture_output=True,
            text=True,
        )
    except OSError as e:
        raise HistoryMissing(f"git cannot read {source}: {e}") from e
    if shown.returncode != 0:
        raise HistoryMissing(f"{source} has no readable {PATH_IN_REPO!r}: {shown.stderr.strip()}")
    return shown.stdout


def _git_dir(source: Path) -> Path:
    return source / ".git" if (source / ".git").exists() else source


def parse_node_sequence(text: str) -> NodeHistory:
    """Node-hours a day from the minute samples (`time,active,total`), whole days only."""
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or not {"time", "active"} <= set(rows[0]):
        raise HistoryMissing("the node sequence has no rows with 'time' and 'active'")
    minutes = np.array([r["time"].replace(" ", "T") for r in rows], dtype="datetime64[m]")
    active = np.array([float(r["active"]) for r in rows])
    # 1. whole days: from the first midnight at or after the first sample to the last
    # midnight after which the log runs a full day.
    first = minutes.min().astype("datetime64[D]")
    if minutes.min() > first:
        first += 1
    end = (minutes.max() + 1).astype("datetime64[D]")
    day = (minutes.astype("datetime64[D]") - first).astype(int)
    days = int((end - first).astype(int))
    if days < 1:
        raise HistoryMissing("the node sequence holds no whole day")
    # 2. samples logged as 0 active are gaps, like minutes that are absent.
    kept = (day >= 0) & (day < days) & (active > 0)
    counts = np.bincount(day[kept], minlength=days)
    if np.any(counts == 0):
        raise HistoryMissing(f"day {int(np.argmin(counts))} of the node sequence has no sample")
    sums = np.bincount(day[kept], weights=active[kept], minlength=days)
    return NodeHistory(
        node_hours=24.0 * sums / counts,
        first_day=str(first),
        gap_minutes=int(days * MINUTES_A_DAY - counts.sum()),
    )


def philly_history(source: Path) -> NodeHistory:
    """The Philly history from `source` (the CSV or the fetched git directory); raises
    HistoryMissing, saying why, when it is absent or unreadable."""
    if not source.exists():
        raise HistoryMissing(
            f"{source} does not exist: fetch {SOURCE} (the fetch tool) and pass its git"
            f" directory, or the file {PATH_IN_REPO!r}, to --philly"
        )
    return parse_node_sequence(_csv_text(source))
