package agent

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolCmd is the kernel's struct ethtool_cmd (ETHTOOL_GSET), of which
// the link speed is read.
type ethtoolCmd struct {
	Cmd           uint32
	Supported     uint32
	Advertising   uint32
	Speed         uint16
	Duplex        uint8
	Port          uint8
	PhyAddress    uint8
	Transceiver   uint8
	Autoneg       uint8
	MdioSupport   uint8
	Maxtxpkt      uint32
	Maxrxpkt      uint32
	SpeedHi       uint16
	EthTpMdix     uint8
	EthTpMdixCtrl uint8
	LpAdvertising uint32
	Reserved      [2]uint32
}

// ifreqData is struct ifreq with its union holding a pointer.
type ifreqData struct {
	Name [unix.IFNAMSIZ]byte
	Data uintptr
	_    [16]byte
}

// linkSpeedMbit is the speed the driver reports for a link of the
// calling thread's network namespace, in Mbit/s; 0 when the driver
// reports none or an unknown speed (virtual links may). The ioctl is
// asked rather than /sys/class/net, which shows the links of the
// namespace that mounted it.
func linkSpeedMbit(dev string) (int64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for the ethtool request: %w", err)
	}
	defer unix.Close(fd)
	cmd := ethtoolCmd{Cmd: unix.ETHTOOL_GSET}
	var req ifreqData
	copy(req.Name[:unix.IFNAMSIZ-1], dev)
	req.Data = uintptr(unsafe.Pointer(&cmd))
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&req))); errno != 0 {
		if errno == unix.EOPNOTSUPP {
			return 0, nil
		}
		return 0, fmt.Errorf("reading the speed of %s: %w", dev, errno)
	}
	speed := uint32(cmd.SpeedHi)<<16 | uint32(cmd.Speed)
	if speed == 0 || speed == 0xffff || speed == 0xffffffff {
		return 0, nil
	}
	return int64(speed), nil
}
