"""Scheduling profiles: the files, their validation and watching, and what the daemon records of
them."""
