"""Queue positions and start estimates of waiting jobs, refreshed by the leading daemon."""
