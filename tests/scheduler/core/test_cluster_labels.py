"""Clusters named by their labels (`scheduler.core.clusters.resolve_placement`): a job's
`cluster_labels` narrow where it may run, `preferred_cluster_labels` (data locality) where it
would rather; the engine then sees names only."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.clusters import NO_CLUSTER, carrying, resolve_placement

CLUSTERS = {
    "a": {"region": "eu", "data.example.com/imagenet": "true"},
    "b": {"region": "eu"},
    "c": {"region": "us", "data.example.com/imagenet": "true"},
}


@pytest.mark.parametrize(
    ("placement", "required", "preferred"),
    [
        ({}, (), ()),
        ({"clusters": ["b"], "preferred_clusters": ["b"]}, ("b",), ("b",)),
        ({"cluster_labels": {"region": "eu"}}, ("a", "b"), ()),
        ({"cluster_labels": {"region": "eu", "data.example.com/imagenet": "true"}}, ("a",), ()),
        ({"clusters": ["b", "c"], "cluster_labels": {"region": "eu"}}, ("b",), ()),
        ({"clusters": ["c"], "cluster_labels": {"region": "eu"}}, (NO_CLUSTER,), ()),
        ({"cluster_labels": {"region": "ap"}}, (NO_CLUSTER,), ()),
        ({"preferred_cluster_labels": {"data.example.com/imagenet": "true"}}, (), ("a", "c")),
        (
            {"preferred_clusters": ["c"], "preferred_cluster_labels": {"region": "eu"}},
            (),
            ("c", "a", "b"),
        ),
        # preferred within the required: a cluster the job may not run in is not preferred
        (
            {
                "cluster_labels": {"region": "eu"},
                "preferred_cluster_labels": {"data.example.com/imagenet": "true"},
            },
            ("a", "b"),
            ("a",),
        ),
    ],
    ids=[
        "anywhere",
        "names-as-given",
        "by-region",
        "by-two-labels",
        "names-narrowed",
        "names-and-labels-disjoint",
        "no-cluster-has-them",
        "data-locality",
        "named-first",
        "preferred-within-required",
    ],
)
def test_placement_by_labels(
    placement: dict[str, Any], required: tuple[str, ...], preferred: tuple[str, ...]
) -> None:
    assert resolve_placement(placement, CLUSTERS) == (required, preferred)


def test_with_one_cluster_a_requirement_it_meets_is_dropped_and_one_it_fails_is_kept() -> None:
    """One cluster: the backend is not a federation and its nodes carry no cluster label, so a
    job asking for that cluster by name or label runs anywhere; one asking for another runs
    nowhere (and waits saying so)."""
    one = {"home": {"region": "eu"}}
    assert resolve_placement({"clusters": ["home"]}, one) == ((), ())
    assert resolve_placement({"cluster_labels": {"region": "eu"}}, one) == ((), ())
    assert resolve_placement({"cluster_labels": {"region": "us"}}, one) == ((NO_CLUSTER,), ())
    assert resolve_placement({"preferred_cluster_labels": {"region": "eu"}}, one) == ((), ())


def test_without_the_clusters_known_names_pass_and_labels_match_nothing() -> None:
    assert resolve_placement({"clusters": ["x"], "preferred_clusters": ["x"]}, {}) == (
        ("x",),
        ("x",),
    )
    assert resolve_placement({"cluster_labels": {"region": "eu"}}, {}) == ((NO_CLUSTER,), ())


names = st.sampled_from(["a", "b", "c", "d"])
pairs = st.dictionaries(st.sampled_from(["region", "site", "data"]), st.sampled_from(["x", "y"]))


@given(
    clusters=st.dictionaries(names, pairs, min_size=2),
    named=st.lists(names, unique=True, max_size=3),
    selector=pairs,
    preferred_named=st.lists(names, unique=True, max_size=3),
    wished=pairs,
)
def test_required_and_preferred_clusters_keep_every_rule(
    clusters: dict[str, dict[str, str]],
    named: list[str],
    selector: dict[str, str],
    preferred_named: list[str],
    wished: dict[str, str],
) -> None:
    placement = {
        "clusters": named,
        "cluster_labels": selector,
        "preferred_clusters": preferred_named,
        "preferred_cluster_labels": wished,
    }
    required, preferred = resolve_placement(placement, clusters)
    if required == (NO_CLUSTER,):
        # nothing both named (when names are given) and carrying the labels
        assert selector
        assert not (set(named or clusters) & set(carrying(clusters, selector)))
        return
    if selector:
        assert required
        assert all(all(clusters[n].get(k) == v for k, v in selector.items()) for n in required)
    else:
        assert required == tuple(named)
    if named:
        assert set(required) <= set(named)
    if required:
        assert set(preferred) <= set(required)
    # every cluster named as preferred (and allowed) is preferred, before those found by labels
    allowed = [n for n in preferred_named if not required or n in required]
    assert list(preferred[: len(allowed)]) == allowed
    assert len(set(preferred)) == len(preferred)
    by_labels = set(carrying(clusters, wished)) if wished else set()
    assert set(preferred) - set(allowed) <= by_labels
