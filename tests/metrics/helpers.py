"""Scraping /metrics and reading the result with prometheus_client's own parser."""

from __future__ import annotations

from collections.abc import Iterable

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "s3cret-scrape-token"


def scrape(client: Client | None = None) -> str:
    client = client or Client(headers={"Authorization": f"Bearer {TOKEN}"})
    response = client.get("/metrics")
    assert response.status_code == 200
    return response.content.decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called `name` (a family's sample, e.g. `x_total` or `x_bucket`), by its
    labels sorted."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample of `name` with exactly these labels (None when absent)."""
    return samples(text, name).get(tuple(sorted(labels.items())))


def label_values(text: str, names: Iterable[str] | None = None) -> set[str]:
    wanted = set(names) if names is not None else None
    return {
        v
        for family in text_string_to_metric_families(text)
        if wanted is None or family.name in wanted
        for sample in family.samples
        for v in sample.labels.values()
    }
