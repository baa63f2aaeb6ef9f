package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// HostVethPrefix starts the name of every host-side veth the plugin creates.
const HostVethPrefix = "weft"

// HostVethName is the deterministic host-side name of the veth for one
// attachment: DEL and GC find it again from (container ID, ifname) alone.
func HostVethName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return HostVethPrefix + hex.EncodeToString(sum[:])[:maxIfNameLen-len(HostVethPrefix)]
}

// isHostVethName reports whether name has the shape of a name HostVethName makes.
func isHostVethName(name string) bool {
	if len(name) != maxIfNameLen || !strings.HasPrefix(name, HostVethPrefix) {
		return false
	}
	for _, c := range name[len(HostVethPrefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
