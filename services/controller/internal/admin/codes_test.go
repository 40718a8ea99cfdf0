package admin

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/sentinels"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// edgeSentinels is every exported sentinel of the packages whose errors
// reach the admin edge, by package directory and name. The test checks it
// against the packages' source, so a sentinel added there fails until it is
// listed here and given a row in codes (the packages without sentinels,
// state and attention, are checked to stay so).
var edgeSentinels = map[string]map[string]error{
	"../leader": {"ErrNotLeader": leader.ErrNotLeader},
	"../transition": {
		"ErrNoStream":       transition.ErrNoStream,
		"ErrPending":        transition.ErrPending,
		"ErrNoRecovery":     transition.ErrNoRecovery,
		"ErrNoCandidate":    transition.ErrNoCandidate,
		"ErrOwnerLive":      transition.ErrOwnerLive,
		"ErrNotCopy":        transition.ErrNotCopy,
		"ErrNotLive":        transition.ErrNotLive,
		"ErrNotFastPath":    transition.ErrNotFastPath,
		"ErrSingleCopy":     transition.ErrSingleCopy,
		"ErrConflict":       transition.ErrConflict,
		"ErrDroppingCopies": transition.ErrDroppingCopies,
	},
	"../placement": {"ErrNotEnoughBrokers": placement.ErrNotEnoughBrokers},
	"../state":     {},
	"../attention": {},
	"../../../../internal/cluster": {
		"ErrNotInDir":      cluster.ErrNotInDir,
		"ErrInvalidName":   cluster.ErrInvalidName,
		"ErrCorrupt":       cluster.ErrCorrupt,
		"ErrInvalidPolicy": cluster.ErrInvalidPolicy,
	},
}

// Every sentinel that can reach the edge has its own row, so none is
// answered as "coordination store unavailable" (a retry) by omission.
func TestCodesCoverEverySentinel(t *testing.T) {
	s := &Service{log: zerolog.Nop()}
	for dir, listed := range edgeSentinels {
		names, err := sentinels.Exported(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if _, ok := listed[name]; !ok {
				t.Errorf("%s.%s is not in edgeSentinels: list it and give it a row in codes", dir, name)
			}
		}
		for name, sentinel := range listed {
			row := -1
			for i, c := range codes {
				if c.err == sentinel {
					row = i
				}
			}
			if row < 0 {
				t.Errorf("%s.%s has no row in codes", dir, name)
				continue
			}
			got := s.toConnect(fmt.Errorf("%w: %q", sentinel, "s"))
			if want := codes[row].code; connect.CodeOf(got) != want {
				t.Errorf("toConnect(%s.%s) = %v, want %v", dir, name, got, want)
			}
		}
	}
}
