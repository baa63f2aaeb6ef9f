package cnitest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ServerSocket is the abstract socket of weft's resident plugin server
// (cni/server.go).
const ServerSocket = "@weft-cni-server"

// ServerPID returns the pid of the process listening on weft's plugin
// server socket in the calling thread's network namespace, 0 if none.
func ServerPID() (int, error) {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return 0, err
	}
	inode := ""
	for line := range strings.SplitSeq(string(b), "\n") {
		// Num RefCount Protocol Flags Type St Inode Path; a listener has
		// the __SO_ACCEPTCON flag.
		if f := strings.Fields(line); len(f) == 8 && f[7] == ServerSocket && f[3] == "00010000" {
			inode = f[6]
		}
	}
	if inode == "" {
		return 0, nil
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && l == "socket:["+inode+"]" {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid, nil
		}
	}
	return 0, nil
}
