// Package docs holds the repository's documentation tests: the pages in this
// directory explain Strand to someone who has only the clone, and
// docs_test.go keeps every tracked file free of references a reader of the
// clone cannot follow. It has no code of its own.
package docs
