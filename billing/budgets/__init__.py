"""Budgets: spend and commitments, the checks at submit and approval, alerts, burn-down,
forecast."""
