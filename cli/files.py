"""Reading the YAML (or JSON) files the CLI is given: a job spec, a what-if proposal.

YAML's own reading keeps the last of a key given twice (`env: {A: 1, A: 2}` is A=2), where
the API refuses a JSON body that repeats a key: a file that says two things is refused here
too, naming the key and its lines, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml
from yaml.constructor import ConstructorError

MERGE = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE:  # `<<: *base`: keys given again there override it
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if not isinstance(key, Hashable):  # YAML says so itself below
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"{key!r} is given twice (lines {seen[key]} and {line}); give each key once",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """The document in `text`; yaml.YAMLError when it is no YAML or repeats a key."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
