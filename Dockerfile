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
 && update-alternatives --set iptables /usr/sbin/iptables-nft \
 && update-alternatives --set ip6tables /usr/sbin/ip6tables-nft \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/weft-agent /src/bin/weft-dns /src/bin/weft-proxy /src/bin/weftctl /usr/local/bin/
COPY --from=build /src/bin/cni/weft /src/bin/cni/portmap /opt/weft/cni/
