package onebox

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/internal/cluster"
)

// Six brokers in three zones. Load and node id alone would put a stream's
// three copies in two zones and replace a lost owner in the wrong one: the
// copies go one per zone, and the copy replacing a lost owner (once it has
// been missing for --replace-after) goes to the zone it leaves uncovered,
// past less loaded brokers of covered zones.
func TestZonesSpreadCopiesAndReplacementsKeepTheSpread(t *testing.T) {
	zones := map[string]string{"a1": "za", "a2": "za", "b1": "zb", "b2": "zb", "c1": "zc", "c2": "zc"}
	c := Start(t, Options{Brokers: []string{"a1", "a2", "b1", "b2", "c1", "c2"}, Controllers: 1, Recoverers: 1, Zones: zones,
		ReplaceAfter: 2 * time.Second})

	res, err := c.Admin().ListBrokers(c.Ctx(), connect.NewRequest(&strandv1.ListBrokersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]string{}
	for _, b := range res.Msg.GetBrokers() {
		shown[b.GetNode()] = b.GetZone()
	}
	if !maps.Equal(shown, zones) {
		t.Fatalf("ListBrokers zones %v, want %v", shown, zones)
	}

	// One copy of x loads a1, so that by load alone a1 is the last pick.
	if x := c.CreateStream("x", 1, cluster.Policy{Name: cluster.LocalDurable}); x.Owner != "a1" {
		t.Fatalf("x placed on %s, want a1 (fewest copies, then node id)", x.Owner)
	}
	a := c.CreateStream("s", 3, majority)
	if z := zonesOf(zones, a.Members()); !oneEach(z) {
		t.Fatalf("created %+v: zones %v, want one copy in each (by load and id alone: a2 b1 b2)", a, z)
	}
	if a.Owner != "a2" {
		t.Fatalf("s owned by %s, want a2", a.Owner)
	}
	c.WaitApplied(a)
	c.Publish(a.Owner, "s", "r0", "r1")

	// The owner stops: a recovery moves the stream to a live copy and
	// keeps a2 as a missing member; past --replace-after the replacement
	// is a1, in the zone no live member covers, not b2 or c2 (fewer
	// copies, covered zones).
	c.StopBroker(a.Owner)
	next := c.WaitAssignment("s", 60*time.Second, "a2 replaced", func(n cluster.Assignment) error {
		if n.Includes("a2") || n.Copies() != 3 {
			return fmt.Errorf("assignment %+v", n)
		}
		if r, pending := c.Recovery("s"); pending {
			return fmt.Errorf("recovery to epoch %d still pending", r.FenceEpoch)
		}
		return nil
	})
	if z := zonesOf(zones, next.Members()); !oneEach(z) {
		t.Fatalf("after the owner's loss: %+v, zones %v, want one copy in each", next, z)
	}
	added := slices.DeleteFunc(next.Members(), a.Includes)
	if !slices.Equal(added, []string{"a1"}) {
		t.Fatalf("added %v for the lost owner a2, want [a1]", added)
	}
}

func zonesOf(zones map[string]string, nodes []string) map[string]int {
	out := map[string]int{}
	for _, n := range nodes {
		out[zones[n]]++
	}
	return out
}

func oneEach(z map[string]int) bool {
	return maps.Equal(z, map[string]int{"za": 1, "zb": 1, "zc": 1})
}
