"""Database helpers every app shares: rows in by COPY (`bulk`), a list as one parameter
(`lookups`, the `__any` lookup), a batch's configuration read once (`shared_reads`), and
SQLite's triggers put back after a table rebuild (`sqlite_triggers`)."""
