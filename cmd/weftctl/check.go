package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/lab/check"
)

// runCheck runs the connectivity test on the lab and prints the table.
func runCheck(args []string) error {
	fs := flag.NewFlagSet("weftctl check", flag.ContinueOnError)
	dir := fs.String("dir", lab.DefaultDir, "lab state directory")
	keep := fs.Bool("keep", false, "keep the probe pods afterwards")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, err := lab.Load(*dir)
	if err != nil {
		return err
	}
	c, err := lab.Client(lab.AdminKubeconfig(*dir))
	if err != nil {
		return err
	}
	results, err := check.Run(context.Background(), st, c, *keep)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KIND\tFROM\tTO\tRESULT\tDETAIL")
	failed := 0
	for _, r := range results {
		res := "ok"
		if !r.OK {
			res, failed = "FAIL", failed+1
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Kind, r.From, r.To, res, r.Detail)
	}
	w.Flush()
	fmt.Printf("\n%d passed, %d failed\n", len(results)-failed, failed)
	if failed > 0 {
		return fmt.Errorf("%d of %d probes failed", failed, len(results))
	}
	return nil
}
