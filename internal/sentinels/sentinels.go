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
