// Package deploy holds the manifests that install weft on a cluster; the lab
// applies the same files, so what the lab verifies is what users install.
package deploy

import _ "embed"

// RBAC is rbac.yaml: weft-agent's ServiceAccount, ClusterRole and binding.
//
//go:embed rbac.yaml
var RBAC []byte
