"""Releases and upgrades: this code's version (`version`), the releases recorded in
releases.toml (`records`), the database's schema against this code (`schema`), and backups
(`backup`). docs/releasing.md, docs/upgrading.md."""
