"""Nodes and their GPUs: inventory, admin actions, the node agent's credential and reports, who
holds each GPU."""
