package agent

import (
	"os"
	"testing"

	"github.com/weftnet/weft/internal/netnsutil"
)

// Kernel tests (the pending tests) run in a private network namespace.
func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }
