package storage

import (
	"errors"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// valueLogGCInterval is how often the value log is checked for space that
// retention, cuts and drops freed.
const valueLogGCInterval = time.Minute

// valueLogGC reclaims value log space. Payloads above the value threshold
// live in the value log (db.go), which Badger only shrinks when asked: a file
// at least half garbage is rewritten. Rewriting is bounded to a few files a
// round so it never competes with appends for long.
func (db *DB) valueLogGC() {
	for range 4 {
		// vlogMu: the GC deletes and maps value log files
		// (mappings_linux.go).
		db.vlogMu.Lock()
		err := db.bdb.RunValueLogGC(0.5)
		db.vlogMu.Unlock()
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
			db.log.Warn().Err(err).Msg("value log GC failed; will retry next round")
		}
		break
	}
}

// every runs fn every interval until the DB stops, then closes done.
func (db *DB) every(interval time.Duration, done chan struct{}, fn func()) {
	defer close(done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-db.stop:
			return
		case <-t.C:
			fn()
		}
	}
}
