package ebpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
)

// DefaultPinPath is where weft pins its maps and links by default.
const DefaultPinPath = "/sys/fs/bpf/weft"

// CgroupV2Mount returns where the cgroup v2 hierarchy is mounted in this
// mount namespace (/sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified
// on hybrid ones): the default --cgroup-root.
func CgroupV2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// "id parent major:minor root mountpoint options ... - fstype source ..."
		fields := strings.Fields(s.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return fields[4], nil
			}
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("reading /proc/self/mountinfo: %w", err)
	}
	return "", errors.New("no cgroup v2 file system is mounted")
}
