"""A real Kubernetes control plane for development, tests and benchmarks.

etcd, kube-apiserver, kube-controller-manager and (for the peers benchmark) kube-scheduler are
built from the Go module proxy at pinned releases (platform/dev/go/), cached by version, and
started on loopback ports with their own certificates. Nodes have no kubelets: `kubelets`
plays them through the API. Not part of the product image: nothing in the product imports it.
"""
