// Package oracle is the reachability oracle for NetworkPolicy: for one
// (source pod, destination pod, port, protocol) it evaluates the
// networking.k8s.io/v1 semantics directly on the API objects, independently
// of the policy compiler, and gives the expected allow/deny. Matrix holds a
// whole grid of answers (expected or measured) and SideBySide prints two
// grids next to each other where they differ.
//
// The only thing shared with the compiler is policy.Validate, which decides
// whether a policy is rejected (a rejected policy isolates the pods it
// selects and allows nothing).
package oracle
