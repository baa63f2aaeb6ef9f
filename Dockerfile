# weft's image for users with a container engine: the same content as
# `make image` (which needs none): Debian's iptables, ipset, nftables and
# conntrack, and weft's static binaries. See docs/deploy.md.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make build

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables ipset nftables conntrack \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/weft-agent /src/bin/weft-dns /src/bin/weft-proxy /src/bin/weftctl /usr/local/bin/
COPY --from=build /src/bin/cni/weft /src/bin/cni/weft-plugin /src/bin/cni/portmap /opt/weft/cni/
# Every iptables name runs weftctl's wrapper until its first call picks the
# node's variant (legacy or nf_tables) and points the names at it.
RUN for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do \
      ln -sf /usr/local/bin/weftctl /usr/sbin/$n; \
    done
