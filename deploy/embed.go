// Package deploy holds the manifests that install weft on a cluster (a
// kustomize base, agent/ and dns/, and overlays/); the lab applies the
// same files, so what the lab verifies is what users install.
package deploy

import _ "embed"

// Namespace is agent/namespace.yaml: weft-system, where weft runs.
//
//go:embed agent/namespace.yaml
var Namespace []byte

// RBAC is agent/rbac.yaml: weft-agent's ServiceAccount, ClusterRole and
// binding.
//
//go:embed agent/rbac.yaml
var RBAC []byte
