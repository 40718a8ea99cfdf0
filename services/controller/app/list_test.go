package app

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// ListStreams pages: pages of k list every stream once, in name order, and
// a stream created behind the listing's position does not shift it. A bad
// page size or token is refused naming its field.
func TestListStreamsPages(t *testing.T) {
	h := newHarness(t)
	h.broker("b1")
	_, c := h.leader(Config{})
	const n = 23
	var want []string
	for i := range n {
		name := fmt.Sprintf("s%02d", (i*7)%n) // created out of order
		create(t, c, name, 1, nil)
		want = append(want, name)
	}
	slices.Sort(want)

	list := func(size int32, token string) (*strandv1.ListStreamsResponse, error) {
		resp, err := c.ListStreams(ctxT(t), connect.NewRequest(&strandv1.ListStreamsRequest{PageSize: size, PageToken: token}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	for _, k := range []int32{1, 5, 23, 100} {
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > n {
				t.Fatalf("page size %d: more than %d pages", k, n)
			}
			page, err := list(k, token)
			if err != nil {
				t.Fatalf("page size %d: %v", k, err)
			}
			if len(page.GetStreams()) > int(k) {
				t.Fatalf("page size %d: a page of %d", k, len(page.GetStreams()))
			}
			for _, s := range page.GetStreams() {
				got = append(got, s.GetSpec().GetName())
			}
			if page.GetNextPageToken() == "" {
				break
			}
			if len(page.GetStreams()) != int(k) {
				t.Fatalf("page size %d: a short page of %d before the last", k, len(page.GetStreams()))
			}
			token = page.GetNextPageToken()
			if k == 5 && pages == 1 {
				// Created behind the listing's position: the pages after
				// this one are unchanged by it.
				create(t, c, "s00a", 1, nil)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("page size %d listed\n%v\nwant\n%v", k, got, want)
		}
		if k == 5 {
			want = append(want, "s00a")
			slices.Sort(want)
		}
	}

	// Without a page size a page is the default size, at least every
	// stream here.
	page, err := list(0, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.GetStreams()) != len(want) || page.GetNextPageToken() != "" {
		t.Fatalf("default page: %d streams, next %q; want all %d", len(page.GetStreams()), page.GetNextPageToken(), len(want))
	}

	for _, bad := range []struct {
		name  string
		size  int32
		token string
		field string
	}{
		{"negative page size", -1, "", "page_size"},
		{"page size above the max", maxListPage + 1, "", "page_size"},
		{"token not base64", 5, "!!", "page_token"},
		{"token of something else", 5, "czAx", "page_token"}, // base64 of "s01"
	} {
		_, err := list(bad.size, bad.token)
		wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.HasPrefix(errMessage(err), bad.field+":") {
			t.Fatalf("%s: %q does not name %s", bad.name, errMessage(err), bad.field)
		}
	}
	if _, err := list(maxListPage, ""); err != nil {
		t.Fatalf("the max page size: %v", err)
	}
}

// maxListPage is the controller's bound on a page.
const maxListPage = 1000
