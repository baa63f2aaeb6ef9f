// Package deploy holds the manifests that install weft on a cluster (a
// kustomize base, agent/ and dns/, and overlays/); the lab applies the
// same files, so what the lab verifies is what users install.
package deploy

import "embed"

// Files are the kustomize base and its overlays, as users apply them.
//
//go:embed kustomization.yaml agent dns overlays components
var Files embed.FS
