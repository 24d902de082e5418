"""`gantry`: the command-line client. It speaks only the REST API and imports no server code."""
