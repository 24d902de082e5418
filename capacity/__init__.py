"""Capacity planning: demand history per GPU model, forecasts with their intervals, the day a
pool saturates, what owning or renting more GPUs costs, and expansion what-ifs
(docs/capacity.md)."""
