"""Metering: allocations -> usage records, one closed hour at a time, and what it missed."""
