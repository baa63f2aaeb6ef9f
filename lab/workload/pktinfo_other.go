//go:build !linux

package workload

import "net"

// oobSize is 0: outside Linux a wildcard UDP listener replies from the
// address the kernel picks.
var oobSize = 0

func enablePktinfo(*net.UDPConn) bool { return false }

func replyPktinfo([]byte) []byte { return nil }
