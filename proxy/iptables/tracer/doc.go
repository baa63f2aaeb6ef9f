// Package tracer is a test oracle for iptables rulesets: it parses an
// iptables-save / iptables-restore text and follows the first packet of a
// flow through it, telling every place that packet can end up.
//
// # Input
//
// Parse reads tables ("*nat", "*filter", ...), chain declarations
// (":NAME POLICY [packets:bytes]"), rules ("-A CHAIN matches -j TARGET
// options"), "-N CHAIN", "-X CHAIN", "COMMIT" and "#" comments. Only the
// nat and filter tables are interpreted; the lines of other tables (mangle,
// raw, ...) are tokenized and their rules counted in Ruleset.Ignored.
// Anything Parse does not understand exactly is an error naming the line,
// so the tracer never silently mis-evaluates a rule. The supported
// vocabulary is: -s, -d (IPv4 or IPv6, host or prefix), -p, -i, -o ("+"
// suffix wildcard), "!" before any negatable option, and the match modules
// tcp/udp/sctp (--dport, --sport, --syn; also implicit after -p),
// multiport, comment, addrtype, mark, conntrack (--ctstate), state,
// statistic, recent and set; the targets are user chains (-j, -g), RETURN,
// ACCEPT, DROP, REJECT, MARK, DNAT, SNAT, MASQUERADE, LOG, NOTRACK and CT.
//
// # Path model
//
// Trace follows the first packet of a flow, which conntrack sees as NEW,
// through these hooks, each a built-in chain of a table:
//
//	from outside (Flow.Local false):
//	    nat PREROUTING, then, by the destination after DNAT,
//	    local (a Flow.NodeIPs address or loopback):  filter INPUT
//	    otherwise (forwarded):                       filter FORWARD, nat POSTROUTING
//	from the node (Flow.Local true):
//	    nat OUTPUT, filter OUTPUT, nat POSTROUTING
//
// Within a hook, rules run in order; a matching rule's target decides:
//   - a user chain (-j) is entered and, when it falls off its end or hits
//     RETURN, the caller continues after the jumping rule;
//   - -g replaces the current chain: its RETURN goes back to the caller of
//     the chain that did the goto (the hook's policy if that was the
//     built-in chain itself);
//   - falling off (or RETURN from) the hook's chain applies its policy;
//   - ACCEPT ends the hook and the packet goes on to the next one; DROP and
//     REJECT end the path with that verdict, in any table;
//   - DNAT (only in PREROUTING or OUTPUT) rewrites the destination address
//     and, if given, port, and ends the hook like ACCEPT; the routing
//     decision that follows uses the new destination;
//   - SNAT and MASQUERADE (only in POSTROUTING or INPUT) set
//     Outcome.Masquerade and end the hook like ACCEPT;
//   - MARK rewrites the packet mark, which later hooks see; LOG, NOTRACK,
//     CT and a rule without target do nothing.
//
// The nat INPUT and mangle/raw hooks are not traversed. After the last hook
// the verdict is ACCEPT. A table or built-in chain
// missing from the ruleset is empty with policy ACCEPT.
//
// Matches are evaluated for the first packet: --ctstate/--state match NEW
// only; -m recent --rcheck/--update/--remove never match and --set always
// does; --syn matches; addrtype LOCAL means a Flow.NodeIPs address or a
// loopback address (127.0.0.0/8, ::1), MULTICAST, BROADCAST
// (255.255.255.255) and UNSPEC are recognised and anything else is UNICAST;
// -m set looks the address up in Flow.Sets and is an error when the set is
// not given there; an -s/-d of the other address family never matches.
// -m statistic with a probability strictly between 0 and 1 (and every
// --mode nth) may match or not: Trace explores both branches, and that is
// the only source of branching. Trace returns the distinct outcomes
// (verdict, DNAT target, masquerade, final mark), each with the Path of the
// first branch that produced it.
//
// Trace fails on a jump or goto to an undeclared chain, on a jump loop
// reached at run time, on more than MaxOutcomes distinct outcomes, and on a
// set missing from Flow.Sets. Check and CheckPrefix find static problems:
// undeclared targets, rules in undeclared chains, duplicate declarations,
// jump cycles and (CheckPrefix) unused chains.
package tracer
