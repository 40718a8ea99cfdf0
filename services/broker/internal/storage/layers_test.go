package storage

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
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

// Each type guards at most one lock's worth of state (doc.go, "Locks"): a
// lock and exactly the state it guards live in a small type of their own,
// which the owning type holds as a named field. A struct type of this
// package or of package engine that declares two sync.Mutex or
// sync.RWMutex fields, directly or through an embedded type (whose fields
// are promoted, so the outer type still keeps them), fails here.
func TestOneLockPerType(t *testing.T) {
	structs := 0
	for _, dir := range []string{".", "engine"} {
		for name, n := range lockCounts(t, dir) {
			structs++
			if n > 1 {
				t.Errorf("%s: struct %s declares %d locks; give each lock and the state it guards a type of its own", dir, name, n)
			}
		}
	}
	if structs < 20 {
		t.Fatalf("found only %d struct types", structs)
	}
}

// lockCounts parses the non-test files of the package in dir and returns,
// for every struct type (named, or anonymous as "Outer.field"), how many
// sync.Mutex and sync.RWMutex fields it declares, counting those of the
// package's own types it embeds.
func lockCounts(t *testing.T, dir string) map[string]int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	type structType struct {
		st   *ast.StructType
		sync string // the file's name for package sync
	}
	fset := token.NewFileSet()
	named := map[string]structType{}
	var all []struct {
		name string
		structType
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		syncName := ""
		for _, imp := range f.Imports {
			if imp.Path.Value == `"sync"` {
				syncName = "sync"
				if imp.Name != nil {
					syncName = imp.Name.Name
				}
			}
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, sp := range gd.Specs {
				ts := sp.(*ast.TypeSpec)
				outer := ts.Name.Name
				ast.Inspect(ts.Type, func(n ast.Node) bool {
					st, ok := n.(*ast.StructType)
					if !ok {
						return true
					}
					name := outer
					if st != ts.Type {
						name = fmt.Sprintf("%s (struct at %s)", outer, fset.Position(st.Pos()))
					} else {
						named[outer] = structType{st, syncName}
					}
					all = append(all, struct {
						name string
						structType
					}{name, structType{st, syncName}})
					return true
				})
			}
		}
	}
	var count func(s structType, seen map[*ast.StructType]bool) int
	count = func(s structType, seen map[*ast.StructType]bool) int {
		if seen[s.st] {
			return 0
		}
		seen[s.st] = true
		n := 0
		for _, fld := range s.st.Fields.List {
			typ := fld.Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			switch typ := typ.(type) {
			case *ast.SelectorExpr:
				if x, ok := typ.X.(*ast.Ident); ok && s.sync != "" && x.Name == s.sync &&
					(typ.Sel.Name == "Mutex" || typ.Sel.Name == "RWMutex") {
					n += max(len(fld.Names), 1)
				}
			case *ast.Ident:
				// Only an embedded type's fields are promoted into
				// this one; a named field's type is counted on its own.
				if emb, ok := named[typ.Name]; ok && len(fld.Names) == 0 {
					n += count(emb, seen)
				}
			}
		}
		return n
	}
	out := map[string]int{}
	for _, s := range all {
		out[s.name] = count(s.structType, map[*ast.StructType]bool{})
	}
	return out
}
