package engine

import (
	"encoding/json"
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

// A third file, unsureFile, keeps that answer until the recovery it asks
// for is done (torn.go): Open writes it before it records the new boot,
// with what the recovery needs to do the same again after a crash in the
// middle of it (on the same boot, when the boot id would no longer tell),
// and removes it once every copy is recovered and marked unsure in its own
// metadata (State.UnsureEpoch).
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

// bootLost tells whether written records may be missing after the last
// stop: it was unclean and the boot changed since (or cannot be told), or
// the recovery of an earlier such open has not finished (unsureFile). It
// only reads.
func bootLost(dir, bootIDPath string) bool {
	cur := readBootID(bootIDPath)
	prev := readBootID(filepath.Join(dir, bootFile))
	clean := fileExists(dir, cleanFile)
	return (!clean && (cur == "" || prev != cur)) || fileExists(dir, unsureFile)
}

// checkBoot decides whether written records may be missing (bootLost),
// then records this open: the recovery to do (unsureFile, kept from an
// earlier open or begun with newest, Badger's newest version now), the
// current boot id, and no clean marker until Close.
func checkBoot(dir, bootIDPath string, newest func() uint64) (mayHaveLost bool, rec unsureRecord, err error) {
	mayHaveLost = bootLost(dir, bootIDPath)
	if mayHaveLost {
		b, rerr := os.ReadFile(filepath.Join(dir, unsureFile))
		if rerr != nil || json.Unmarshal(b, &rec) != nil || rec.From == 0 {
			// Before the new boot id, which would hide the loss from a
			// later open on this boot.
			n := newest()
			rec = unsureRecord{From: n, Newest: n}
			if err := saveUnsure(dir, rec); err != nil {
				return false, rec, err
			}
		}
	}
	if err := writeFileSync(dir, bootFile, []byte(readBootID(bootIDPath)+"\n")); err != nil {
		return false, rec, err
	}
	if err := os.Remove(filepath.Join(dir, cleanFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, rec, fmt.Errorf("storage: removing %s: %w", cleanFile, err)
	}
	if err := syncDir(dir); err != nil {
		return false, rec, err
	}
	return mayHaveLost, rec, nil
}

func saveUnsure(dir string, rec unsureRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeFileSync(dir, unsureFile, b)
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
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("storage: syncing %s: %w", dir, err)
	}
	return nil
}
