"""Prometheus series, computed from the database at scrape time (docs/metrics.md)."""
