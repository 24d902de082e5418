"""Utilization history: samples in, roll-ups, idle GPUs, the dashboards' data and the queue's
history."""
