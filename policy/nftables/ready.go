package nftables

import (
	"context"
	"fmt"
	"net/netip"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/policy/readyset"
)

// ReadySet is the agent's access to the ready sets of the inet table
// (ready4, ready6): the pod addresses whose policy state is programmed.
// The applier creates them and never writes them; the CNI plugin takes
// addresses out (readyset.Revoke, over netlink), the agent puts them in.
type ReadySet struct{ NFT knftables.Interface }

// Members lists the addresses of both sets; a missing set is empty.
func (r ReadySet) Members(ctx context.Context) (map[netip.Addr]bool, error) {
	m := map[netip.Addr]bool{}
	for _, name := range []string{readyset.NFTSet4, readyset.NFTSet6} {
		els, err := r.NFT.ListElements(ctx, "set", name)
		if knftables.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing set inet %s %s: %w", TableName, name, err)
		}
		for _, e := range els {
			if len(e.Key) != 1 {
				continue
			}
			a, err := netip.ParseAddr(e.Key[0])
			if err != nil {
				return nil, fmt.Errorf("set inet %s %s: element %q: %w", TableName, name, e.Key[0], err)
			}
			m[a] = true
		}
	}
	return m, nil
}

// Add puts addrs in their sets, which must exist (an apply creates them).
func (r ReadySet) Add(ctx context.Context, addrs []netip.Addr) error {
	return r.write(ctx, addrs, (*knftables.Transaction).Add)
}

// Del takes addrs, which must be members, out of their sets.
func (r ReadySet) Del(ctx context.Context, addrs []netip.Addr) error {
	return r.write(ctx, addrs, (*knftables.Transaction).Delete)
}

func (r ReadySet) write(ctx context.Context, addrs []netip.Addr, op func(*knftables.Transaction, knftables.Object)) error {
	if len(addrs) == 0 {
		return nil
	}
	tx := r.NFT.NewTransaction()
	for _, a := range addrs {
		op(tx, &knftables.Element{Set: readyset.NFTSetName(a), Key: []string{a.Unmap().String()}})
	}
	if err := r.NFT.Run(ctx, tx); err != nil {
		return fmt.Errorf("writing the ready sets of inet %s: %w", TableName, err)
	}
	return nil
}
