package ebpf

// The BPF objects are built from bpf/*.c by bpf2go and committed (no clang
// is needed to build weft); `make generate` rebuilds them and `make test`
// checks that a rebuild gives the committed bytes.
//go:generate go tool bpf2go -tags linux -target bpfel -type svc_key -type svc_value -type backend sock bpf/sock.c -- -I/usr/include/x86_64-linux-gnu -O2 -Wall -Werror
