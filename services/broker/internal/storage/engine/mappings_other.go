//go:build !linux

package engine

// mapAdvisor advises Badger's file mappings on Linux (mappings_linux.go);
// elsewhere it does nothing.
type mapAdvisor struct{}

func newMapAdvisor(string) *mapAdvisor { return &mapAdvisor{} }

func (a *mapAdvisor) wrote(int) {}
