"""Node names across clusters. The home cluster's nodes keep their plain names (an upgraded
installation's nodes, allocations and history stay as they are); every other cluster's are
`<cluster>:<node>`. Kubernetes node names are DNS subdomains and cannot hold ":", so no
qualified name is ever a home node's."""

from __future__ import annotations

SEPARATOR = ":"


def qualified(cluster: str, node: str, *, home: bool) -> str:
    return node if home else f"{cluster}{SEPARATOR}{node}"


def split(name: str, home: str) -> tuple[str, str]:
    """(cluster, the node's name in its cluster); a plain name is the home cluster's."""
    cluster, sep, node = name.partition(SEPARATOR)
    return (cluster, node) if sep else (home, name)
