"""The one door between the database and the engine: rows read, turned into `scheduler.core` types,
cached between cycles, and the queue window."""
