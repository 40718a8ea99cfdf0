package onebox

import (
	"fmt"
	"strings"
	"testing"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/client"
)

// Two clients configured with the same producer id, one after the other
// (a restarted process), each store their own records. A new client's
// sequences start at 1 again: stamped under the very same id, the broker
// took them for retries of the first client's records, answered them as
// duplicates and stored nothing. Each client adds a session of its own to
// the configured id.
func TestClientsSharingAProducerIDKeepTheirRecords(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Brokers: []string{"b1"}, Controllers: 1})
	const stream = "shared-id"
	a := c.CreateStream(stream, 1, majority)
	for run := range 2 {
		cl, err := client.New(client.Config{Brokers: c.Addrs(), ProducerID: "svc-a"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(cl.ProducerID(), "svc-a-") {
			t.Errorf("producer id %q does not name the configured prefix", cl.ProducerID())
		}
		for i := range 3 {
			res, err := cl.Publish(c.Ctx(), stream, []*strandv1.Record{{Payload: fmt.Appendf(nil, "run%d-%d", run, i)}})
			if err != nil {
				t.Fatal(err)
			}
			if res.GetDuplicate()[0] {
				t.Errorf("run %d record %d answered as a duplicate of an earlier client's", run, i)
			}
		}
		_ = cl.Close()
	}
	got, err := c.ReadAll(a.Owner, stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 {
		t.Fatalf("the stream holds %d records, want 6 (3 of each client)", len(got))
	}
	if _, err := client.New(client.Config{Brokers: c.Addrs(), ProducerID: strings.Repeat("p", client.MaxProducerIDPrefix+1)}); err == nil {
		t.Error("a producer id above MaxProducerIDPrefix was taken")
	}
}
