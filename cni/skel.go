package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// The plugin's own entry point for the CNI protocol: reading the runtime's
// environment and stdin, checking the configuration's cniVersion, running
// the command and printing its result or spec error. It does what the
// reference skeleton does for a plugin, with the rules of the CNI 1.1
// specification, but without that package's dependencies (its version
// conversion registry, regular expressions compiled at start-up and the
// namespace helpers): a plugin process lives for one command, and every
// package initialiser it links is paid on every ADD and DEL.

// SupportedVersions are the CNI specification versions the plugin serves.
var SupportedVersions = []string{"0.4.0", "1.0.0", "1.1.0"}

// CmdArgs is one invocation: the runtime's CNI_* variables and the network
// configuration it passed on stdin, and where the command prints. A command
// uses nothing process-wide (environment, standard streams, working
// directory): the resident server (server.go) runs many at once.
type CmdArgs struct {
	ContainerID string
	Netns       string
	IfName      string
	Args        string
	Path        string
	StdinData   []byte
	// Stdout receives the command's result, Stderr its diagnostics.
	Stdout, Stderr io.Writer

	trace bool      // TraceEnv was set in the command's environment
	start time.Time // when the command began, for its trace
}

// Commands holds the function serving each CNI command.
type Commands struct {
	Add, Del, Check, GC, Status func(*CmdArgs) error
}

// PluginMain runs the command the process's environment names, prints its
// result or error as the specification says, and returns the exit status
// (non-zero on error). about is printed, with the supported versions, when
// a person runs the plugin without CNI_COMMAND.
func PluginMain(cmds Commands, about string) int {
	return Run(cmds, about, os.Getenv, os.Stdin, os.Stdout, os.Stderr, initTime)
}

// Run serves one command whose environment getenv reads, printing what a
// plugin process would print to stdout and stderr, and returns the exit
// status the process would have. start is when the command began (its
// trace counts from there).
func Run(cmds Commands, about string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer, start time.Time) int {
	err := dispatch(cmds, about, getenv, stdin, stdout, stderr, start)
	if err == nil {
		return 0
	}
	if out, merr := json.Marshal(err); merr == nil {
		_, _ = stdout.Write(append(out, '\n'))
	}
	return 1
}

// envVar is a CNI_* variable, with the commands that require it and how a
// present value is checked for them.
type envVar struct {
	name     string
	required []string
	validate func(string) *types.Error
}

var envVars = []envVar{
	{name: "CNI_COMMAND"},
	{name: "CNI_CONTAINERID", required: []string{"ADD", "CHECK", "DEL"}, validate: validContainerID},
	{name: "CNI_NETNS", required: []string{"ADD", "CHECK"}},
	{name: "CNI_IFNAME", required: []string{"ADD", "CHECK", "DEL"}, validate: validEnvIfName},
	{name: "CNI_ARGS"},
	{name: "CNI_PATH", required: []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}},
}

func dispatch(cmds Commands, about string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer, start time.Time) *types.Error {
	cmd := getenv("CNI_COMMAND")
	vals := map[string]string{}
	var missing []string
	for _, v := range envVars {
		val := getenv(v.name)
		vals[v.name] = val
		req := slices.Contains(v.required, cmd)
		switch {
		case val == "" && (req || v.name == "CNI_COMMAND"):
			missing = append(missing, v.name)
		case val != "" && req && v.validate != nil:
			if err := v.validate(val); err != nil {
				return err
			}
		}
	}
	if cmd == "" && about != "" {
		fmt.Fprintln(stderr, about)
		fmt.Fprintf(stderr, "CNI protocol versions supported: %s\n", strings.Join(SupportedVersions, ", "))
		return nil
	}
	if len(missing) > 0 {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("required env variables [%s] missing", strings.Join(missing, ",")), "")
	}
	if cmd == "VERSION" {
		return printJSON(stdout, struct {
			CNIVersion        string   `json:"cniVersion"`
			SupportedVersions []string `json:"supportedVersions"`
		}{SupportedVersions[len(SupportedVersions)-1], SupportedVersions})
	}
	fn := map[string]func(*CmdArgs) error{"ADD": cmds.Add, "DEL": cmds.Del, "CHECK": cmds.Check, "GC": cmds.GC, "STATUS": cmds.Status}[cmd]
	if fn == nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("unknown CNI_COMMAND: %s", cmd), "")
	}
	stdinData, err := io.ReadAll(stdin)
	if err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("error reading from stdin: %v", err), "")
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
	}
	if err := json.Unmarshal(stdinData, &conf); err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("error unmarshall network config: %v", err), "")
	}
	if conf.Name == "" {
		return types.NewError(types.ErrInvalidNetworkConfig, "missing network name", "")
	}
	if !validName(conf.Name) {
		return types.NewError(types.ErrInvalidNetworkConfig, "invalid characters found in network name", conf.Name)
	}
	if !slices.Contains(SupportedVersions, conf.CNIVersion) {
		return types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions",
			fmt.Sprintf("config is %q, plugin supports %q", conf.CNIVersion, SupportedVersions))
	}
	if (cmd == "GC" || cmd == "STATUS") && conf.CNIVersion != "1.1.0" {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("config version does not allow %s", cmd), conf.CNIVersion)
	}
	args := &CmdArgs{
		ContainerID: vals["CNI_CONTAINERID"],
		Netns:       vals["CNI_NETNS"],
		IfName:      vals["CNI_IFNAME"],
		Args:        vals["CNI_ARGS"],
		Path:        vals["CNI_PATH"],
		StdinData:   stdinData,
		Stdout:      stdout,
		Stderr:      stderr,
		trace:       getenv(TraceEnv) != "",
		start:       start,
	}
	if err := fn(args); err != nil {
		var te *types.Error
		if errors.As(err, &te) {
			return te
		}
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return nil
}

// printJSON writes v to w as one JSON document.
func printJSON(w io.Writer, v any) *types.Error {
	b, err := json.Marshal(v)
	if err == nil {
		_, err = w.Write(append(b, '\n'))
	}
	if err != nil {
		return types.NewError(types.ErrIOFailure, "writing the result", err.Error())
	}
	return nil
}

// validName reports whether s is a valid container ID or network name:
// a letter or digit, then letters, digits, '_', '.' and '-'.
func validName(s string) bool {
	for i, c := range s {
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return s != ""
}

func validContainerID(id string) *types.Error {
	if !validName(id) {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID: invalid characters in containerID", id)
	}
	return nil
}

func validEnvIfName(name string) *types.Error {
	if err := validIfName(name); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_IFNAME: "+err.Error(), name)
	}
	return nil
}
