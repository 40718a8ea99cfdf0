package onebox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// logKeep bounds what a Log keeps: the newest bytes of a service's log.
const logKeep = 1 << 20

// Log collects one service's JSON log lines, so a test can dump them when it
// fails and look for an event a service reports only in its log. It keeps
// the newest logKeep bytes.
type Log struct {
	name string

	mu  sync.Mutex
	buf []byte
}

func newLog(name string) *Log { return &Log{name: name} }

// Write implements io.Writer for zerolog.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	if over := len(l.buf) - logKeep; over > 0 {
		cut := over
		if i := bytes.IndexByte(l.buf[over:], '\n'); i >= 0 {
			cut = over + i + 1
		}
		l.buf = append([]byte(nil), l.buf[cut:]...)
	}
	return len(p), nil
}

// String returns what the log kept.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// Tail returns the last n lines.
func (l *Log) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(l.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Entries returns the kept lines whose message is msg, decoded. Numbers
// decode as float64, as encoding/json does.
func (l *Log) Entries(msg string) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(l.String(), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			continue
		}
		if e["message"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// Find returns the first kept line whose message is msg and whose fields
// include every one of fields (numbers compared by value).
func (l *Log) Find(msg string, fields map[string]any) (map[string]any, bool) {
	for _, e := range l.Entries(msg) {
		match := true
		for k, want := range fields {
			if fmt.Sprint(e[k]) != fmt.Sprint(normalize(want)) {
				match = false
				break
			}
		}
		if match {
			return e, true
		}
	}
	return nil, false
}

// normalize makes integers print as encoding/json's float64 of them does.
func normalize(v any) any {
	switch n := v.(type) {
	case int:
		return float64(n)
	case int64:
		return float64(n)
	case uint64:
		return float64(n)
	case uint32:
		return float64(n)
	}
	return v
}
