package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
)

// cost is what one plugin command cost its process tree, from the rusage
// wait4 reports (the plugin and the children it waited for, such as the
// reference bridge's host-local): CPU time and minor page faults. Unlike
// wall time these hardly move with the machine's load.
type cost struct {
	cpu, sys time.Duration
	faults   int64
}

// commandCosts runs rounds ADD+DEL pairs per plugin, interleaved, each
// plugin started directly (as libcni starts it, with the same environment
// and stdin) so that its rusage can be read, and prints the median CPU time
// and page faults per command and the ratio of CPU per pair.
func commandCosts(bin string, subjects []subject, rounds int) error {
	confs := make([][]byte, len(subjects))
	for i, s := range subjects {
		c, err := pluginConf(s)
		if err != nil {
			return err
		}
		confs[i] = c
	}
	type key struct{ plugin, cmd string }
	res := map[key][]cost{}
	for r := range rounds {
		for i, s := range subjects {
			id := fmt.Sprintf("cost%d", r*len(subjects)+i)
			path, err := netnsutil.NewNamed(id)
			if err != nil {
				return err
			}
			for _, cmd := range []string{"ADD", "DEL"} {
				c, err := runPlugin(bin, s.list.Plugins[0].Network.Type, cmd, id, path, confs[i])
				if err != nil {
					_ = netnsutil.Delete(id)
					return fmt.Errorf("%s %s: %w", s.name, cmd, err)
				}
				res[key{s.name, cmd}] = append(res[key{s.name, cmd}], c)
			}
			_ = netnsutil.Delete(id)
		}
	}
	fmt.Printf("\ncost per command, %d interleaved pairs, started directly (medians of rusage: CPU = user + system, the plugin and its children; for weft, plus the resident server's CPU and faults during the command)\n", rounds)
	fmt.Printf("%-20s %-4s %10s %10s %8s\n", "plugin", "cmd", "CPU", "of it sys", "faults")
	pairCPU := map[string]time.Duration{}
	for _, s := range subjects {
		for _, cmd := range []string{"ADD", "DEL"} {
			cs := res[key{s.name, cmd}]
			cpu := median(cs, func(c cost) int64 { return int64(c.cpu) })
			sys := median(cs, func(c cost) int64 { return int64(c.sys) })
			faults := median(cs, func(c cost) int64 { return c.faults })
			pairCPU[s.name] += time.Duration(cpu)
			fmt.Printf("%-20s %-4s %10s %10s %8d\n", s.name, cmd, round(time.Duration(cpu)), round(time.Duration(sys)), faults)
		}
	}
	fmt.Printf("ratio weft / bridge+host-local, CPU per ADD+DEL pair: %.2fx\n",
		float64(pairCPU[subjects[0].name])/float64(pairCPU[subjects[1].name]))
	return nil
}

// pluginConf is the configuration libcni would pass the list's first
// plugin: its own config with the list's name and cniVersion.
func pluginConf(s subject) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(s.list.Plugins[0].Bytes, &m); err != nil {
		return nil, err
	}
	m["name"] = s.list.Name
	m["cniVersion"] = s.list.CNIVersion
	return json.Marshal(m)
}

// runPlugin runs one command of plugin typ and returns its cost. For weft,
// whose shim hands the command to the node's resident server, that is the
// shim's cost plus what the server spent meanwhile.
func runPlugin(bin, typ, cmd, id, netns string, conf []byte) (cost, error) {
	server, _ := cnitest.ServerPID()
	before, _ := processUsage(server)
	c := exec.Command(filepath.Join(bin, typ))
	c.Env = []string{
		"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + id, "CNI_NETNS=" + netns,
		"CNI_IFNAME=eth0", "CNI_PATH=" + bin, "PATH=" + os.Getenv("PATH"),
	}
	c.Stdin = bytes.NewReader(conf)
	out, err := c.CombinedOutput()
	if err != nil {
		return cost{}, fmt.Errorf("%w: %s", err, out)
	}
	ru, ok := c.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return cost{}, fmt.Errorf("no rusage")
	}
	sys := time.Duration(syscall.TimevalToNsec(ru.Stime))
	c0 := cost{cpu: time.Duration(syscall.TimevalToNsec(ru.Utime)) + sys, sys: sys, faults: ru.Minflt}
	if after, err := processUsage(server); server != 0 && err == nil {
		c0.cpu += after.cpu - before.cpu
		c0.faults += after.faults - before.faults
	}
	return c0, nil
}

// processUsage is the CPU time (the sum of its threads' run time, in ns,
// from schedstat) and minor page faults of a running process so far.
func processUsage(pid int) (cost, error) {
	if pid == 0 {
		return cost{}, fmt.Errorf("no process")
	}
	var c cost
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return c, fmt.Errorf("process %d: no tasks", pid)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that exited
		}
		ns, _ := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
		c.cpu += time.Duration(ns)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return c, err
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	// After the command name: state is field 3, minflt field 10.
	if f := strings.Fields(rest); len(f) > 7 {
		c.faults, _ = strconv.ParseInt(f[7], 10, 64)
	}
	return c, nil
}

func median(cs []cost, f func(cost) int64) int64 {
	v := make([]int64, len(cs))
	for i, c := range cs {
		v[i] = f(c)
	}
	slices.Sort(v)
	return v[len(v)/2]
}
