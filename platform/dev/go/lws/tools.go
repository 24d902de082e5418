//go:build tools

// Package tools pins the command that devcluster builds: LeaderWorkerSet's controller manager,
// which makes a LeaderWorkerSet's pods in the development control plane.
package tools

import (
	_ "sigs.k8s.io/lws/cmd"
)
