package admin

import (
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/rs/zerolog"

	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/sentinels"
	"github.com/strandhq/strand/services/controller/internal/leader"
	"github.com/strandhq/strand/services/controller/internal/placement"
	"github.com/strandhq/strand/services/controller/internal/rebalance"
	"github.com/strandhq/strand/services/controller/internal/transition"
)

// edgeSentinels is every exported sentinel of the packages whose errors
// reach the admin edge, by package directory and name. The test checks it
// against the packages' source, so a sentinel added there fails until it is
// listed here and given a row in codes (the packages without sentinels,
// state and attention, are checked to stay so).
var edgeSentinels = map[string]map[string]error{
	".":         {"ErrBusy": ErrBusy},
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
	"../rebalance": {
		"ErrNoBroker":     rebalance.ErrNoBroker,
		"ErrNotFollower":  rebalance.ErrNotFollower,
		"ErrAlreadyOwner": rebalance.ErrAlreadyOwner,
		"ErrNotInSync":    rebalance.ErrNotInSync,
		"ErrOwnerDown":    rebalance.ErrOwnerDown,
		"ErrCatchUp":      rebalance.ErrCatchUp,
		"ErrLastBroker":   rebalance.ErrLastBroker,
	},
	"../state":     {},
	"../attention": {},
	"../../../../internal/auth": {
		"ErrInvalid":      auth.ErrInvalid,
		"ErrNotCommitted": auth.ErrNotCommitted,
		"ErrBootstrapped": auth.ErrBootstrapped,
	},
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
	sentinels.CheckTable(t, edgeSentinels, func(sentinel error) (connect.Code, bool) {
		for _, c := range codes {
			if errors.Is(c.err, sentinel) {
				return c.code, true
			}
		}
		return 0, false
	}, s.toConnect)
}
