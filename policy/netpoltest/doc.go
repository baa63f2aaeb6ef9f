// Package netpoltest holds the NetworkPolicy test bed shared by the pure,
// kernel and lab tests: the upstream e2e world (namespaces x, y, z, each
// with pods a, b, c serving TCP and UDP on ports 80 and 81), the upstream
// scenarios, and a random policy generator. Each test holds real or
// compiled behaviour against policy/oracle on this bed.
package netpoltest
