"""The Kubernetes backend: pods, inventory, watches, logs and namespaces on a real cluster."""
