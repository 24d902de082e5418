//go:build tools

// Package tools pins the command that devcluster builds: JobSet's controller manager (the
// module's root package), which makes a JobSet's Jobs in the development control plane.
package tools

import (
	_ "sigs.k8s.io/jobset"
)
