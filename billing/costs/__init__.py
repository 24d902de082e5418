"""Costs: the lines of any window, one job's cost, what a job may cost before it runs, quotes,
charts."""
