// Package tierbox holds the pure address and port arithmetic the policy
// backends share: unions of peer blocks (prefixes minus exceptions) as
// disjoint address ranges, port spans cut into disjoint boxes (Boxes:
// the union of what several rules allow; TierBoxes: first-match tier
// rules, each box owned by the verdict of the first rule covering it),
// and address ranges written as prefixes (CIDRs). It knows nothing of
// nftables or iptables: the nftables backend writes boxes as interval set
// elements, the iptables backend as ipset entries.
package tierbox
