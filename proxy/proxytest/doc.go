// Package proxytest is the service proxy's backend-neutral real-traffic
// scenario table. A backend's tests call Run with a way to build the
// backend (a proxy mode plus any per-test setup it needs); Run builds a node
// of network namespaces (pods wired by the weft CNI plugin behind a bridge,
// an outside host on the node network), programs Services through the
// backend and checks what users see: who answered, and the source address
// the server saw.
//
// A backend that does not support a feature yet declares it in
// Backend.Unsupported; the scenarios needing it skip with a message naming
// the backend, the feature and the reason, never silently.
//
// The package also holds the scenario's address plan and object builders,
// which backend-specific tests reuse, and the backends' benchmark cluster
// (BenchObjects, fed to a tracker as the proxier's informers feed it).
package proxytest
