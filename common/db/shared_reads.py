"""Reads shared by a batch of work: inside `shared_reads()`, a function marked `@shared` answers
each set of arguments once, and later calls in the block get that first answer.

For what a batch only reads and does not change: the platform's configuration that every
submission of the workload controller's pass reads again (the nodes' inventory, approval
policies, registries, priority defaults, flavors, the submitting user and project). On a loaded
host each read is a round trip of milliseconds, and a submission made about 37 of them: a
burst of Jobs was queued at 6-7 a second. A block lasts one pass (a second), or the few
seconds its caller keeps the answers for (`kept`: Jobs arriving one a pass read it all again
each), so a change of configuration is seen that much later; outside a block nothing is shared
and every call reads.

Never mark a read of what the batch itself changes (quota usage, budget spend, reservations,
the jobs): each submission must see the ones before it. Arguments must be hashable; a call
whose arguments are not (an unsaved model) reads as if outside the block. Answers are shared
objects: callers must not change them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_answers: ContextVar[dict[Any, Any] | None] = ContextVar("gantry_shared_reads", default=None)


@contextlib.contextmanager
def shared_reads(kept: dict[Any, Any] | None = None) -> Iterator[None]:
    """Within the block, each `@shared` function reads once per set of arguments (nested
    blocks share the outer one's answers). `kept`: the answers of earlier blocks, kept by a
    caller that runs a block every pass and reads again only every few seconds (the workload
    controller), which it fills in turn."""
    if _answers.get() is not None:
        yield
        return
    token = _answers.set({} if kept is None else kept)
    try:
        yield
    finally:
        _answers.reset(token)


def shared(fn: Callable[P, T]) -> Callable[P, T]:
    """Mark `fn` as a read a `shared_reads()` block may answer once."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        answers = _answers.get()
        if answers is None:
            return fn(*args, **kwargs)
        try:
            key = (fn, args, frozenset(kwargs.items()))
            hash(key)
        except TypeError:  # an unsaved model, a list: not shared
            return fn(*args, **kwargs)
        if key not in answers:
            answers[key] = fn(*args, **kwargs)
        answers_of: T = answers[key]
        return answers_of

    return wrapper
