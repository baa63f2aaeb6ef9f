package main

import "fmt"

func report(o options, res map[string]result) {
	fmt.Printf("\n== weft-dns vs CoreDNS: %d Services, dnsperf -c %d for %s per run, server on CPU %s, dnsperf on CPU %s\n",
		o.services, o.clients, o.duration, o.serverCPU, o.clientCPU)
	fmt.Printf("%-8s %10s %10s %10s %10s %10s %10s %10s\n", "server", "qps", "avg ms", "p50 ms", "p99 ms", "RSS MiB", "peak MiB", "ready s")
	for _, name := range []string{"weft", "coredns"} {
		r, ok := res[name]
		if !ok {
			continue
		}
		if r.err != nil {
			fmt.Printf("%-8s error: %v\n", name, r.err)
			continue
		}
		fmt.Printf("%-8s %10.0f %10.3f %10.3f %10.3f %10.1f %10.1f %10.1f\n", name, r.qps, r.avgLat*1e3, ms(r.p50), ms(r.p99),
			float64(r.rssKiB)/1024, float64(r.hwmKiB)/1024, r.ready.Seconds())
	}
	w, wok := res["weft"]
	c, cok := res["coredns"]
	if !wok || !cok || w.err != nil || c.err != nil {
		return
	}
	ratio := func(a, b float64) string {
		if b == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	fmt.Printf("weft/CoreDNS: qps %s (target >= 1.50x), p99 %s (target <= 1.00x), RSS %s, peak memory %s\n",
		ratio(w.qps, c.qps), ratio(float64(w.p99), float64(c.p99)), ratio(float64(w.rssKiB), float64(c.rssKiB)), ratio(float64(w.hwmKiB), float64(c.hwmKiB)))
	verdict := "MET"
	if w.qps < 1.5*c.qps || w.p99 > c.p99 {
		verdict = "NOT MET"
	}
	fmt.Printf("target (>= 1.5x CoreDNS qps at no worse p99): %s\n", verdict)
}
