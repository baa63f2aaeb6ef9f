// Package kube delivers Kubernetes state to weft's consumers from one of two
// sources behind one interface: client-go informers against an API server,
// or a directory of YAML/JSON manifests (for standalone weft-proxy). Either
// way a consumer is told "synced" only once its handler has received every
// object of the initial state, never when only an informer's cache has
// them: consumers act on that signal (the proxy's first sync), and must not
// act on a partial view.
package kube
