package placement

import (
	"errors"
	"slices"
	"testing"
)

func TestPick(t *testing.T) {
	l := Load{
		Live:   []string{"b3", "b1", "b2", "b4"},
		Copies: map[string]int{"b1": 2, "b2": 0, "b3": 1, "b4": 0},
	}
	cases := []struct {
		n       int
		exclude []string
		want    []string
		err     error
	}{
		{1, nil, []string{"b2"}, nil},
		{2, nil, []string{"b2", "b4"}, nil},
		{3, nil, []string{"b2", "b4", "b3"}, nil},
		{4, nil, []string{"b2", "b4", "b3", "b1"}, nil},
		{5, nil, nil, ErrNotEnoughBrokers},
		{2, []string{"b2"}, []string{"b4", "b3"}, nil},
		{4, []string{"b2"}, nil, ErrNotEnoughBrokers},
	}
	for _, c := range cases {
		got, err := Pick(l, c.n, c.exclude)
		if !errors.Is(err, c.err) {
			t.Errorf("Pick(%d, %v): err %v, want %v", c.n, c.exclude, err, c.err)
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Pick(%d, %v) = %v, want %v", c.n, c.exclude, got, c.want)
		}
	}
}

func TestPlaceSpreadsOwners(t *testing.T) {
	l := Load{
		Live:   []string{"b1", "b2", "b3"},
		Copies: map[string]int{"b1": 1, "b2": 1, "b3": 1},
		Owned:  map[string]int{"b1": 1},
	}
	owner, followers, err := Place(l, 3)
	if err != nil {
		t.Fatal(err)
	}
	if owner != "b2" || !slices.Equal(followers, []string{"b1", "b3"}) {
		t.Fatalf("Place = %s %v, want b2 [b1 b3]", owner, followers)
	}
	if _, _, err := Place(l, 4); !errors.Is(err, ErrNotEnoughBrokers) {
		t.Fatalf("Place(4) err = %v, want ErrNotEnoughBrokers", err)
	}
}

// A draining broker takes no new copy, even the least loaded.
func TestPickSkipsDraining(t *testing.T) {
	l := Load{Live: []string{"a", "b", "c"}, Copies: map[string]int{"a": 5, "b": 0, "c": 3}, Draining: map[string]bool{"b": true}}
	got, err := Pick(l, 1, nil)
	if err != nil || len(got) != 1 || got[0] != "c" {
		t.Fatalf("Pick = %v, %v; want [c]", got, err)
	}
	if _, err := Pick(l, 3, nil); err == nil {
		t.Fatal("three copies over two brokers that do not drain: want an error")
	}
}
