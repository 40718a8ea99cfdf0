// Package sentinels lists a package's sentinel errors from its source, so
// the test of an RPC edge's code table can fail when a sentinel is added
// without a row (docs/errors.md).
package sentinels

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
)

// Exported returns the names of the exported package-level variables named
// Err* declared in the non-test Go files of the package in dir, sorted.
func Exported(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("sentinels: %w", err)
	}
	fset := token.NewFileSet()
	var names []string
	files := 0
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("sentinels: %w", err)
		}
		files++
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.VAR {
				continue
			}
			for _, spec := range gen.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if strings.HasPrefix(id.Name, "Err") && id.IsExported() {
						names = append(names, id.Name)
					}
				}
			}
		}
	}
	if files == 0 {
		return nil, fmt.Errorf("sentinels: no Go files in %s", dir)
	}
	slices.Sort(names)
	return names, nil
}

// CheckTable holds an RPC edge's code table to every sentinel that can
// reach it. listed maps the directory of each package whose errors reach
// the edge to its sentinels by name; t fails for an exported Err* of the
// source that listed lacks (so a new sentinel needs a row), for a listed
// sentinel that row (the table's entry for exactly that value) does not
// find, and for one that toConnect, given the sentinel wrapped as the
// packages return it, answers with another code than its row's.
func CheckTable(t testing.TB, listed map[string]map[string]error, row func(error) (connect.Code, bool), toConnect func(error) error) {
	t.Helper()
	for dir, byName := range listed {
		names, err := Exported(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if _, ok := byName[name]; !ok {
				t.Errorf("%s.%s is not listed: list it and give it a row in the edge's table", dir, name)
			}
		}
		for name, sentinel := range byName {
			want, ok := row(sentinel)
			if !ok {
				t.Errorf("%s.%s has no row in the edge's table", dir, name)
				continue
			}
			if got := toConnect(fmt.Errorf("%w: %q", sentinel, "s")); connect.CodeOf(got) != want {
				t.Errorf("%s.%s answers %v, want %v", dir, name, got, want)
			}
		}
	}
}
