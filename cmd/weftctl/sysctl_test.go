package main

import "testing"

// TestSetSysctlsBadInput: arguments that are not NAME=VALUE, or none, fail
// naming the argument, before anything is written.
func TestSetSysctlsBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no NAME=VALUE given"},
		{[]string{"net.ipv4.ip_forward"}, `"net.ipv4.ip_forward": not NAME=VALUE`},
		{[]string{"=1"}, `"=1": not NAME=VALUE`},
		{[]string{"net.ipv4.ip_forward="}, `"net.ipv4.ip_forward=": not NAME=VALUE`},
		// No setting is made when one argument is bad.
		{[]string{"net.weft.nothing=1", "x"}, `"x": not NAME=VALUE`},
	} {
		err := setSysctls(tc.args)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: error %v, want %s", tc.args, err, tc.want)
		}
	}
	if err := setSysctls([]string{"-help"}); err != nil {
		t.Errorf("-help: %v", err)
	}
}
