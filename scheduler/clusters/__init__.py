"""Several clusters: the rows platform admins manage (services), what is read of them
(selectors), and the backends the daemon builds from them (backends). docs/multicluster.md."""
