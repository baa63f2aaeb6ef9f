package userspace

import "time"

// AllJumps are the iptables glue's jumps (RenderIPTables inserts the
// missing ones).
func AllJumps() []IPTablesJump { return iptablesJumps }

// SetClock makes b read the time from now (affinity timeouts); call it
// before the first Sync.
func SetClock(b *Backend, now func() time.Time) { b.now = now }
