"""The simulated cluster: a backend that runs no containers (`cluster`), its state kept
across restarts (`state`), its logs (`logs`), its nodes (`inventory`) and the demo's load
(`load`)."""
