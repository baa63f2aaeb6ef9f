package iptmode

import "testing"

func TestChoose(t *testing.T) {
	const hint = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
	const canary = "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	const threeRules = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j A\n-A INPUT -j B\n-A INPUT -j C\nCOMMIT\n"
	const oneRule = "*nat\n-A POSTROUTING -j MASQUERADE\nCOMMIT\n"
	for _, c := range []struct {
		name, legacy, nft string
		want              Mode
	}{
		{"nothing anywhere", "", "", NFT},
		{"kubelet's hint in legacy", hint, "", Legacy},
		{"kubelet's hint in nft", "", hint, NFT},
		{"the hint wins over rule counts", threeRules + canary, oneRule + hint, NFT},
		{"the canary in legacy", canary + oneRule, threeRules, Legacy},
		{"more rules in legacy", threeRules, oneRule, Legacy},
		{"more rules in nft", oneRule, threeRules, NFT},
		{"a tie", oneRule, oneRule, NFT},
		{"a chain named like the hint's prefix", "*mangle\n:KUBE-IPTABLES-HINTS - [0:0]\n-A X -j Y\nCOMMIT\n", "", Legacy},
	} {
		if got := Choose(c.legacy, c.nft); got != c.want {
			t.Errorf("%s: chose %s, want %s", c.name, got, c.want)
		}
	}
}

func TestIsName(t *testing.T) {
	for argv0, want := range map[string]bool{"iptables": true, "/usr/sbin/ip6tables-restore": true, "weftctl": false, "iptables-nft": false} {
		if IsName(argv0) != want {
			t.Errorf("IsName(%q) = %v", argv0, !want)
		}
	}
}
