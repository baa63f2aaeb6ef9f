// Package buildinfo carries the version stamped into every weft binary.
package buildinfo

// Version is set at link time: -ldflags "-X github.com/weftnet/weft/internal/buildinfo.Version=...".
var Version = "dev"
