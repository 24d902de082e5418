"""What-if replays: the last N days of real jobs replayed in `scheduler.sim` under today's
settings and under proposed quotas, weights and priorities, side by side (docs/what-if.md)."""
