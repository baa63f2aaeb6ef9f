package bgp

import "github.com/weftnet/weft/routing"

// Mode is weft-agent's --routing value for BGP. In this mode the agent's
// host-gw/VXLAN reconciler removes its own routes and devices (a switch
// from those modes leaves nothing behind) and this package installs the
// routes instead.
const Mode routing.Mode = "bgp"
