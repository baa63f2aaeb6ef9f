package ebpf

// The BPF objects are built from bpf/*.c by bpf2go and committed (no clang
// is needed to build weft); `make generate` rebuilds them and `make test`
// checks that a rebuild gives the committed bytes (BPF_OUT, when set,
// is where that rebuild writes).
//go:generate go tool bpf2go -output-dir=${BPF_OUT} -tags linux -target bpfel -type svc_key -type svc_value -type backend -type affinity_member sock bpf/sock.c -- -I/usr/include/x86_64-linux-gnu -O2 -Wall -Werror
//go:generate go tool bpf2go -output-dir=${BPF_OUT} -tags linux -target bpfel -type tuple -type ct_value -type nat_rev_value -type src_range_key nodeport bpf/nodeport.c -- -I/usr/include/x86_64-linux-gnu -O2 -Wall -Werror
//go:generate go tool bpf2go -output-dir=${BPF_OUT} -tags linux -target bpfel -type udp_stale_key udpdestroy bpf/udpdestroy.c -- -I/usr/include/x86_64-linux-gnu -O2 -Wall -Werror
//go:generate go tool bpf2go -output-dir=${BPF_OUT} -tags linux -target bpfel -type tcp_gone_key tcpflows bpf/tcpflows.c -- -I/usr/include/x86_64-linux-gnu -O2 -Wall -Werror
