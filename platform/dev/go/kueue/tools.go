//go:build tools

// Package tools pins the command that devcluster builds: Kueue's manager, run beside Gantry in
// bench/k8s_kueue.py.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
