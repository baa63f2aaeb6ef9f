// Package userspace is weft's userspace service proxy (weft-proxy --mode
// userspace): the model (proxy/model) rendered as listening sockets in the
// proxy process, which copy each connection or UDP session to an endpoint
// it picks. It is the proxy for places where kernel rules are unavailable
// or unwanted (a laptop, a CI container without NET_ADMIN, a sandbox), and
// the simplest way in for a test that only needs "this name reaches one of
// these endpoints".
//
// # Design note: two ways in, one data path
//
// Every listener serves one service port in one scope: Internal (the
// ClusterIPs) or External (NodePorts, externalIPs, LoadBalancer IPs), each
// with the endpoints model.Select gives that scope. There are two ways for
// clients to reach the listeners:
//
//   - redirect (the original kube-proxy design): listeners on the wildcard
//     address of each family, and a constant glue in the kernel (iptables
//     or nftables, whichever the node uses) that REDIRECTs each frontend
//     (address, protocol, port) to its listener's port, rejects frontends
//     without endpoints, drops those with endpoints none of which this node
//     may use, enforces loadBalancerSourceRanges, and drops connections to
//     the listeners' ports that were not redirected (so that the ports
//     cannot be used to bypass the rest);
//   - rootless (Config.Listen set): listeners on that one address, Internal
//     scope only, no kernel rules at all. A test dials the listener's
//     address, which the service map (Backend.Services, served as /services
//     by weft-proxy) names.
//
// Compute, then apply: Plan turns a model.State into listener specs (pure);
// the backend binds what is new, hands existing listeners their new
// endpoint lists (one atomic swap each: established connections are not
// touched), and closes what is gone; Glue turns the specs and the ports
// actually bound into the frontends' verdicts (pure), rendered for
// iptables-restore or as one nft transaction, and applied whole.
//
// Ports: each listener tries, in order, the service's own port (rootless
// mode only) and then ports of Config.PortRange starting at one derived from
// a hash of the listener's key, so a listener gets the same port from one
// run to the next unless something else holds it. A listener keeps its port
// for its life. A listener that cannot bind any candidate is reported with
// its Service and port (the sync fails, and is retried, while every other
// listener is programmed); its frontends are rejected meanwhile.
//
// The data path: TCP connections are accepted, an endpoint is picked (round
// robin, or the client's remembered endpoint under ClientIP affinity, kept
// for the Service's timeout since the client's last new connection), and
// the bytes are copied both ways (splice(2) between the two sockets);
// an endpoint that refuses or does not answer in Config.DialTimeout is
// skipped for the next. UDP datagrams are grouped into sessions by client
// address and port: a session is a connected socket to one endpoint, ended
// after Config.UDPIdleTimeout without traffic or when its endpoint leaves
// the list (the next datagram then starts a new session, as a conntrack
// flush does for the kernel backends); a session whose endpoint answers
// with ICMP port unreachable before any reply is moved to the next endpoint
// with its last datagram sent again. Replies leave from the address the
// client sent to (IP_PKTINFO), which the glue's conntrack entry translates
// back to the frontend. Concurrent TCP connections and UDP sessions are
// bounded (Config.MaxConnections, MaxUDPSessions); beyond the bounds new
// connections are reset and new sessions' datagrams dropped, and counted.
//
// What it cannot do, by design: the endpoint sees the proxy's own address,
// never the client's (upstream documented the same for its userspace mode);
// connections live in the proxy process and end when it exits, so a restart
// drops them; SCTP is not proxied (reported in the service map).
package userspace
