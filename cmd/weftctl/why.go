package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/weftnet/weft/internal/buildinfo"
	"github.com/weftnet/weft/internal/why"
	"github.com/weftnet/weft/kube"
	"github.com/weftnet/weft/lab"
)

// runWhy prints the verdict the compiled policies give a connection, and
// what decided it (internal/why).
func runWhy(args []string) error {
	fs := flag.NewFlagSet("weftctl why", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default $KUBECONFIG, else the lab's at --dir when a lab is there, else ~/.kube/config)")
	dir := fs.String("dir", lab.DefaultDir, "lab state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 3 {
		return fmt.Errorf("want FROM TO PORT[/PROTO] (FROM and TO: NAMESPACE/POD or an address), got %q", fs.Args())
	}
	port, proto, err := why.ParsePort(fs.Arg(2))
	if err != nil {
		return err
	}
	path := kubeconfigPath(*kubeconfig, *dir)
	ua := "weftctl/" + buildinfo.Version
	c, err := kube.NewClient(path, ua)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	cc, err := kube.NewClusterPolicyClient(path, ua)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := why.State(ctx, c, cc)
	if err != nil {
		return err
	}
	a, err := why.NewExplainer(in).Explain(why.Query{From: fs.Arg(0), To: fs.Arg(1), Port: port, Protocol: proto})
	if err != nil {
		return err
	}
	a.Print(os.Stdout)
	return nil
}

// kubeconfigPath: the flag, $KUBECONFIG, the lab's admin kubeconfig, or
// ~/.kube/config.
func kubeconfigPath(flagValue, labDir string) string {
	if flagValue != "" {
		return flagValue
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		return env
	}
	if p := lab.AdminKubeconfig(labDir); fileExists(p) {
		return p
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".kube", "config")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
