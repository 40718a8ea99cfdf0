package placement

import (
	"errors"
	"maps"
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

// zonesOf counts how many of nodes each zone holds.
func zonesOf(l Load, nodes []string) map[string]int {
	out := map[string]int{}
	for _, n := range nodes {
		out[l.Zone[n]]++
	}
	return out
}

func TestPickSpreadsZones(t *testing.T) {
	// Zone a's brokers are the least loaded: by load alone every copy
	// would go there.
	three := Load{
		Live:   []string{"a1", "a2", "a3", "b1", "b2", "c1", "c2"},
		Copies: map[string]int{"a1": 0, "a2": 0, "a3": 0, "b1": 5, "b2": 4, "c1": 7, "c2": 9},
		Zone:   map[string]string{"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b", "c1": "c", "c2": "c"},
	}
	two := Load{
		Live:   []string{"a1", "a2", "b1", "b2"},
		Copies: map[string]int{"a1": 0, "a2": 1, "b1": 3, "b2": 2},
		Zone:   map[string]string{"a1": "a", "a2": "a", "b1": "b", "b2": "b"},
	}
	noZones := Load{
		Live:   []string{"a1", "a2", "a3", "b1", "b2", "c1", "c2"},
		Copies: three.Copies,
	}
	cases := []struct {
		name    string
		l       Load
		n       int
		exclude []string
		want    []string
		zones   map[string]int // zones of the members (live, in exclude) and picks together
	}{
		{"3 zones, 3 copies: one per zone, least loaded in each", three, 3, nil, []string{"a1", "b2", "c1"}, map[string]int{"a": 1, "b": 1, "c": 1}},
		{"2 zones, 3 copies: 2+1", two, 3, nil, []string{"a1", "b2", "a2"}, map[string]int{"a": 2, "b": 1}},
		{"3 zones, 5 copies: 2+2+1", three, 5, nil, []string{"a1", "b2", "c1", "a2", "b1"}, map[string]int{"a": 2, "b": 2, "c": 1}},
		{"replacement keeps spread: members in a and b, the pick goes to c", three, 1, []string{"a1", "b1"}, []string{"c1"}, map[string]int{"a": 1, "b": 1, "c": 1}},
		{"replacement of a member gone from a: zone a again", three.Without([]string{"a1"}), 1, []string{"a1", "b1", "c1"}, []string{"a2"}, map[string]int{"a": 1, "b": 1, "c": 1}},
		{"growth from 3 to 5 over 3 zones: the two picks in two zones", three, 2, []string{"a1", "b1", "c1"}, []string{"a2", "b2"}, map[string]int{"a": 2, "b": 2, "c": 1}},
		{"no zone set: by load, as without zones", noZones, 3, nil, []string{"a1", "a2", "a3"}, map[string]int{"": 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Pick(c.l, c.n, c.exclude)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("Pick(%d, %v) = %v, want %v", c.n, c.exclude, got, c.want)
			}
			var members []string
			for _, m := range c.exclude {
				if slices.Contains(c.l.Live, m) {
					members = append(members, m)
				}
			}
			if z := zonesOf(c.l, append(members, got...)); !maps.Equal(z, c.zones) {
				t.Fatalf("zones %v, want %v", z, c.zones)
			}
		})
	}
}

func TestPlaceSpreadsZones(t *testing.T) {
	l := Load{
		Live:   []string{"a1", "a2", "b1", "c1"},
		Copies: map[string]int{"a1": 0, "a2": 0, "b1": 1, "c1": 1},
		Owned:  map[string]int{"a1": 1},
		Zone:   map[string]string{"a1": "a", "a2": "a", "b1": "b", "c1": "c"},
	}
	owner, followers, err := Place(l, 3)
	if err != nil {
		t.Fatal(err)
	}
	all := append([]string{owner}, followers...)
	if z := zonesOf(l, all); !maps.Equal(z, map[string]int{"a": 1, "b": 1, "c": 1}) {
		t.Fatalf("Place = %s %v: zones %v, want one copy in each", owner, followers, z)
	}
	if owner != "b1" {
		t.Fatalf("owner %s, want b1 (owns nothing; a1 owns a stream)", owner)
	}
}

func TestWithoutLeavesLoadAlone(t *testing.T) {
	l := Load{Live: []string{"b1", "b2", "b3"}}
	w := l.Without([]string{"b2"})
	if !slices.Equal(w.Live, []string{"b1", "b3"}) || !slices.Equal(l.Live, []string{"b1", "b2", "b3"}) {
		t.Fatalf("Without: %v, original now %v", w.Live, l.Live)
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
