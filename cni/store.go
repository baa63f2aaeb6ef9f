package cni

import (
	"github.com/containernetworking/cni/pkg/types"

	"github.com/weftnet/weft/ipam"
)

// openStore opens the network's allocation state under ipam.dataDir.
func openStore(cfg *Config) (ipam.Store, error) {
	dir, err := ipam.NetworkDir(cfg.IPAM.DataDir, cfg.Name)
	if err != nil {
		return nil, errInvalidConfig("name", err.Error(), cfg.Name)
	}
	store, err := ipam.NewDiskStore(dir)
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, "ipam.dataDir: cannot open the allocation store", err.Error())
	}
	return store, nil
}
