"""Statements and closing: lines rolled up per period, closed and adjusted, reconciled, guarded at
the database."""
