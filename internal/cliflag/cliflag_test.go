package cliflag

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestListsParseAndReject(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var ips Addrs
	var cidrs Prefixes
	fs.Var(&ips, "node-ip", "")
	fs.Var(&cidrs, "cluster-cidr", "")
	if err := fs.Parse([]string{"--node-ip", "172.18.0.11, fd00::11", "--node-ip=10.0.0.1", "--cluster-cidr", "10.244.1.7/16,,fd00:10:244::/56"}); err != nil {
		t.Fatal(err)
	}
	if ips.String() != "172.18.0.11,fd00::11,10.0.0.1" || cidrs.String() != "10.244.0.0/16,fd00:10:244::/56" {
		t.Fatalf("got %s and %s", ips.String(), cidrs.String())
	}
	for _, args := range [][]string{{"--node-ip", "172.18.0.300"}, {"--cluster-cidr", "10.244.0.0/33"}} {
		err := fs.Parse(args)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Fatalf("%v: got %v, want an error naming the flag", args, err)
		}
	}
}
