package storage

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The stream-copy model is written against the log engine's API only
// (doc.go, "Layers"): no non-test file of this package imports Badger.
// Badger's types, errors and options stay in package engine.
func TestModelDoesNotImportBadger(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		files++
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if path == "github.com/dgraph-io/badger/v4" || strings.HasPrefix(path, "github.com/dgraph-io/badger/v4/") {
				t.Errorf("%s imports %s: the model must go through package engine", name, path)
			}
		}
	}
	if files < 10 {
		t.Fatalf("parsed only %d files of the package", files)
	}
}
