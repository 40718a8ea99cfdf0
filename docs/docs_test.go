package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// outsideRef matches a reference that only someone outside the clone could
// follow: a path into a sibling "shared" directory, the design and style
// files that lived there, or an issue of a tracker by number (the word, then a number
// with or without "#", in any case, also broken across a comment line). What such a line meant
// belongs in docs/ or in the comment itself.
//
// "issue" must start a word and be followed by a number, so "issues",
// a word that only ends in it ("tissue"), and "the issue is" pass.
var outsideRef = regexp.MustCompile(`(?i)\.\.[/]shared\b|\b(?:DESIGN|STYLE)\.md\b|stream-failover\.md|\bissue(?:\s|//|#)+[0-9]`)

// The table builds its inputs from pieces so that this file, which the scan
// below reads too, holds none of them whole.
func TestOutsideRefMatcher(t *testing.T) {
	const up, shared, iss = "../", "shared", "iss"
	for _, tc := range []struct {
		text string
		want bool
	}{
		{up + shared + "/x", true},
		{"see `" + up + shared + "/seed/x.md`", true},
		{"Iss" + "ue 12", true},
		{"(" + iss + "ue 3's target)", true},
		{iss + "ue #585", true},
		{"IS" + "SUE 4, item 4", true},
		{"// " + iss + "ue\n// 7", true},
		{"DESIGN" + ".md", true},
		{"STYLE" + ".md", true},
		{"stream-failover" + ".md", true},
		{iss + "ues", false},
		{iss + "ues 3", false},
		{"t" + iss + "ue 3", false},
		{"the " + iss + "ue is load", false},
		{iss + "ue a seal", false},
		{"../" + "sharedness", false},
		{"replace github.com/strandhq/strand => ../", false},
		{"github.com/dgraph-io/badger/" + iss + "ues/585", false},
	} {
		if got := outsideRef.MatchString(tc.text); got != tc.want {
			t.Errorf("outsideRef.MatchString(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

// scanned reports whether TestNoOutsideReferences reads the tracked file
// name (slash-separated, from the repository root). The directories under
// third_party/ are not read: they hold vendored upstream source
// (third_party/badger is Badger as the module proxy serves it, and
// third_party/badger-patches diffs of it, whose context lines are
// upstream's), and their comments cite upstream's own tracker, not ours.
// Editing them to pass would make the tree differ from upstream plus its
// patches, which make check-badger forbids. What we wrote there is read:
// the READMEs, and the files directly in third_party/ (badger.sh).
func scanned(name string) bool {
	rest, ok := strings.CutPrefix(name, "third_party/")
	return !ok || !strings.Contains(rest, "/") || path.Base(name) == "README.md"
}

func TestScanned(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"third_party/badger/levels.go", false},
		{"third_party/badger/y/watermark.go", false},
		{"third_party/badger-patches/0001-value-log-pwrite.patch", false},
		{"third_party/badger.sh", true},
		{"third_party/badger/README.md", true},
		{"services/broker/internal/storage/vlog.go", true},
		{"docs/architecture.md", true},
		{"go.mod", true},
		{"services/third_party/x.go", true},
		{"third_partyx/x.go", true},
	} {
		if got := scanned(tc.name); got != tc.want {
			t.Errorf("scanned(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNoOutsideReferences scans every tracked file (git ls-files) that
// scanned admits for outsideRef. examples/go.mod's replace directive points
// at "../", the main module, and does not match.
func TestNoOutsideReferences(t *testing.T) {
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse: %v", err)
	}
	dir := strings.TrimSpace(string(root))
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = dir
	list, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := strings.Split(strings.TrimRight(string(list), "\x00"), "\x00")
	if len(files) < 50 {
		t.Fatalf("git ls-files listed %d files; the scan would prove nothing", len(files))
	}
	for _, f := range files {
		if !scanned(f) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, loc := range outsideRef.FindAllIndex(b, -1) {
			line := 1 + bytes.Count(b[:loc[0]], []byte("\n"))
			t.Errorf("%s:%d: %q refers outside the repository; say what it is for, or link docs/", f, line, b[loc[0]:loc[1]])
		}
	}
}
