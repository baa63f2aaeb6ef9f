// Package policy turns NetworkPolicies, Pods and Namespaces into
// backend-neutral per-pod rules (Compile), and evaluates those rules for one
// packet (Desired.Allows). It is pure: no kernel, no logging.
//
// Semantics follow the networking.k8s.io/v1 API: a pod is isolated for a
// direction only when a policy selecting it lists that type (policyTypes
// defaults to Ingress, plus Egress when the policy has egress rules); the
// allowed traffic of a direction is the union of the rules of every policy
// selecting the pod. Reply traffic and the node's own traffic to its pods are
// the backend's business (conntrack and the hook points), not the rules'.
//
// A policy that fails validation (Validate) contributes no allow, but the
// pods it would select stay isolated in the directions it names (both when
// those cannot be told): bad input fails closed.
//
// The package policy/oracle answers the same question independently,
// straight from the API objects, so that tests can hold the compiler and the
// kernel against it.
package policy
