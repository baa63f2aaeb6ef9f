// Package workload is the program every lab pod runs: a small, predictable
// network server in the spirit of Kubernetes' agnhost netexec, plus the
// client helpers the lab's connectivity checker and tests use to talk to it.
//
// A workload serves three protocols, each on any number of addresses
// (host:port, IPv4 or IPv6, wildcard or specific; port 0 picks a free port):
//
// HTTP, with these endpoints:
//
//	GET /          {"pod":"<name>","client":"<ip>","clientPort":<port>,"host":"<Host header>"}
//	GET /hostname  <name>, as text/plain
//	GET /healthz   ok
//	GET /echo?msg=x  x
//
// TCP echo: the first line a client sends (up to and including '\n') is
// answered with "<name> saw <client ip>\n"; every byte after that line is
// echoed back until the client half-closes, and then the server half-closes
// too.
//
// UDP echo: every datagram is answered with "<name> saw <client ip>: <payload>",
// but a size probe (package internal/pmtu) only with its
// first line: a client sends packets of any size and gets a small answer,
// so that one direction of a path is measured (weftctl check's MTU rows).
// On a wildcard address the reply is sent from the address the datagram was
// sent to (IP_PKTINFO / IPV6_PKTINFO on Linux), so connected clients, and
// clients that reached the pod through an address other than the one the
// kernel would pick as source, still accept it.
//
// In every reply the client IP is the peer address the server saw: an IPv4
// peer on a dual-stack socket is shown in IPv4 form (127.0.0.1, not
// ::ffff:127.0.0.1) and an IPv6 zone is dropped. That is what lets the lab
// tell whether a connection was SNATed on its way to the pod.
//
// Run serves until its context is done; HTTPGet, TCPExchange and
// UDPExchange are one-shot clients, each on a fresh connection, bounded by
// the context's deadline (DefaultTimeout if it has none).
package workload
