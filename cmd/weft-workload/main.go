// Command weft-workload is the program every weft lab pod runs: an HTTP
// server, a TCP echo server and a UDP echo server that name the pod and the
// client address they saw (see package lab/workload for the protocol).
//
//	weft-workload [--name NAME] [--http ADDR]... [--tcp-echo ADDR]... [--udp-echo ADDR]... [--ready-file PATH]
//
// Defaults: --name $POD_NAME, else the hostname; --http :80 --tcp-echo :81
// --udp-echo :81. Giving a listener flag replaces its default; it may be
// repeated or take a comma-separated list, and an empty value (--udp-echo=)
// turns that protocol off.
//
// With --ready-file, once every listener is bound the file is written
// (atomically) with one "<kind> <address>" line per listener, e.g.
// "http 127.0.0.1:80", so a supervisor knows the workload is up and which
// ports it got for port 0. The file is removed at startup and on exit.
//
// SIGTERM or SIGINT stops the workload; it then exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/weftnet/weft/internal/buildinfo"
	"github.com/weftnet/weft/lab/workload"
)

// listFlag is a repeatable flag holding addresses. The first use replaces
// the default; each use may carry a comma-separated list; an empty value
// adds nothing.
type listFlag struct {
	vals []string
	set  bool
}

func (f *listFlag) String() string { return strings.Join(f.vals, ",") }

func (f *listFlag) Set(v string) error {
	if !f.set {
		f.vals, f.set = nil, true
	}
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			f.vals = append(f.vals, p)
		}
	}
	return nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("weft-workload: ")

	name := flag.String("name", defaultName(), "pod `name` to report: $POD_NAME, else the hostname")
	httpAddrs := &listFlag{vals: []string{":80"}}
	tcpAddrs := &listFlag{vals: []string{":81"}}
	udpAddrs := &listFlag{vals: []string{":81"}}
	flag.Var(httpAddrs, "http", "HTTP listen `address` (repeatable, comma-separated; empty for none)")
	flag.Var(tcpAddrs, "tcp-echo", "TCP echo listen `address` (repeatable, comma-separated; empty for none)")
	flag.Var(udpAddrs, "udp-echo", "UDP echo listen `address` (repeatable, comma-separated; empty for none)")
	readyFile := flag.String("ready-file", "", "write the bound addresses to `path` once listening")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(flag.CommandLine.Output(), "unexpected arguments: %q\n", flag.Args())
		flag.Usage()
		os.Exit(2)
	}

	if err := run(*name, httpAddrs.vals, tcpAddrs.vals, udpAddrs.vals, *readyFile); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func run(name string, httpAddrs, tcpAddrs, udpAddrs []string, readyFile string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	if readyFile != "" {
		// A file left by an earlier run must not pass for this one's.
		if err := os.Remove(readyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		defer os.Remove(readyFile)
	}

	log.Printf("%s (weft %s) starting", name, buildinfo.Version)
	var lines []string
	opts := workload.Options{
		Name:         name,
		HTTPAddrs:    httpAddrs,
		TCPEchoAddrs: tcpAddrs,
		UDPEchoAddrs: udpAddrs,
		Bound: func(kind, addr string) {
			log.Printf("%s listening on %s", kind, addr)
			lines = append(lines, kind+" "+addr+"\n")
		},
	}
	err := workload.Run(ctx, opts, func() {
		if readyFile == "" {
			return
		}
		if err := writeFileAtomic(readyFile, strings.Join(lines, "")); err != nil {
			cancel(fmt.Errorf("ready file: %w", err))
		}
	})
	if err != nil {
		return err
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	log.Printf("stopped")
	return nil
}

// writeFileAtomic writes data to a temporary file next to path and renames
// it into place, so a reader never sees a partial file.
func writeFileAtomic(path, data string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.WriteString(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

func defaultName() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return "weft-workload"
}
