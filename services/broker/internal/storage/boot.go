package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Unclean stops and machine crashes. An owner ships records to its
// followers once Badger has taken them, before its own fsync ends
// (Stream.WrittenTail). A crash of the broker process loses none of them:
// Badger writes through memory maps, so they are in the OS page cache and
// the next open finds them. A crash of the machine can: a follower may then
// hold records past the owner's log at the owner's epoch, and an owner that
// went on appending at that epoch would give other records the same
// offsets. The DB notes whether that may have happened, so the broker can
// refuse to continue such an epoch (replica, "unsure owner").
//
// Two files next to Badger's tell: bootFile holds the kernel's boot id as
// of the last open, and cleanFile exists only between a clean Close (all
// synced) and the next open. Written records may be missing after the last
// stop exactly when it was not clean and the machine has rebooted since, or
// when the boot id cannot be told.

// A third file, unsureFile, keeps that answer until every stream copy has
// been told: Open writes it before it records the new boot, marks every
// copy (State.UnsureEpoch, in the copy's own metadata) and checks its
// newest segments (torn.go), and only then removes it. A crash before that
// (the same boot, so the boot id would no longer tell) leaves it, and the
// next open does the same again.
const (
	bootFile   = "STRAND_BOOT_ID"
	cleanFile  = "STRAND_CLEAN"
	unsureFile = "STRAND_UNSURE"
)

// BootIDPath is where Linux publishes the id of the running boot.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

func readBootID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// checkBoot decides whether written records may be missing, then records
// this open: the current boot id, and no clean marker until Close.
func checkBoot(dir, bootIDPath string) (mayHaveLost bool, err error) {
	cur := readBootID(bootIDPath)
	prev := readBootID(filepath.Join(dir, bootFile))
	_, cerr := os.Stat(filepath.Join(dir, cleanFile))
	clean := cerr == nil
	mayHaveLost = (!clean && (cur == "" || prev != cur)) || fileExists(dir, unsureFile)
	if mayHaveLost {
		// Before the new boot id, which would hide the loss from a later
		// open on this boot.
		if err := writeFileSync(dir, unsureFile, nil); err != nil {
			return false, err
		}
	}
	if err := writeFileSync(dir, bootFile, []byte(cur+"\n")); err != nil {
		return false, err
	}
	if err := os.Remove(filepath.Join(dir, cleanFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("storage: removing %s: %w", cleanFile, err)
	}
	if err := syncDir(dir); err != nil {
		return false, err
	}
	return mayHaveLost, nil
}

// removeFileSync removes dir/name, if there, durably.
func removeFileSync(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("storage: removing %s: %w", name, err)
	}
	return syncDir(dir)
}

func fileExists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// markClean records a clean stop: everything written is synced.
func markClean(dir string) error {
	return writeFileSync(dir, cleanFile, nil)
}

// forgetBoot removes the boot record after a failed write: the page cache
// may have dropped what the failed fsync covered, so even a restart on the
// same boot must not trust that written records are there.
func forgetBoot(dir string) {
	_ = os.Remove(filepath.Join(dir, bootFile))
	_ = syncDir(dir)
}

func writeFileSync(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("storage: writing %s: %w", name, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("storage: writing %s: %w", name, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("storage: syncing %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("storage: syncing %s: %w", dir, err)
	}
	return nil
}
