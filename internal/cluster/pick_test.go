package cluster

import "testing"

func TestFurthestPickAndTieBreak(t *testing.T) {
	cases := []struct {
		name  string
		cands []Candidate
		want  string
	}{
		{"highest record tail", []Candidate{{"a", 5, 9}, {"b", 7, 0}, {"c", 6, 9}}, "b"},
		{"tie on records: highest cursor event tail", []Candidate{{"a", 7, 1}, {"b", 7, 3}}, "b"},
		{"tie on both: lowest node id", []Candidate{{"b", 7, 3}, {"a", 7, 3}, {"c", 7, 3}}, "a"},
		{"byte-wise node order", []Candidate{{"b", 1, 1}, {"B", 1, 1}}, "B"},
		{"byte-wise, not numeric", []Candidate{{"b9", 1, 1}, {"b10", 1, 1}}, "b10"},
		{"one", []Candidate{{"x", 0, 0}}, "x"},
	}
	for _, c := range cases {
		got, ok := Furthest(c.cands)
		if !ok || got.Node != c.want {
			t.Errorf("%s: picked %+v, want %s", c.name, got, c.want)
		}
	}
	if _, ok := Furthest(nil); ok {
		t.Error("no candidates: want ok false")
	}
}

func TestFurthestPreferring(t *testing.T) {
	cases := []struct {
		name      string
		cands     []Candidate
		preferred string
		want      string
	}{
		{"preferred tied at the furthest wins", []Candidate{{"a", 7, 3}, {"b", 7, 3}}, "b", "b"},
		{"preferred behind on records loses", []Candidate{{"a", 7, 3}, {"b", 6, 3}}, "b", "a"},
		{"preferred behind on cursor events loses", []Candidate{{"a", 7, 3}, {"b", 7, 2}}, "b", "a"},
		{"preferred ahead wins as the furthest", []Candidate{{"a", 7, 3}, {"b", 8, 0}}, "b", "b"},
		{"preferred not a candidate", []Candidate{{"b", 7, 3}, {"a", 7, 3}}, "z", "a"},
		{"no preference: lowest node id", []Candidate{{"b", 7, 3}, {"a", 7, 3}}, "", "a"},
		{"three tied, preferred in the middle", []Candidate{{"a", 7, 3}, {"b", 7, 3}, {"c", 7, 3}}, "b", "b"},
	}
	for _, c := range cases {
		got, ok := FurthestPreferring(c.cands, c.preferred)
		if !ok || got.Node != c.want {
			t.Errorf("%s: picked %+v, want %s", c.name, got, c.want)
		}
	}
	if _, ok := FurthestPreferring(nil, "a"); ok {
		t.Error("no candidates: want ok false")
	}
}
