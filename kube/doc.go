// Package kube delivers Kubernetes state to weft's consumers from one of two
// sources behind one interface: client-go informers against an API server,
// or a directory of YAML/JSON manifests (for standalone weft-proxy).
package kube
