package storage

import (
	"encoding/json"
	"strconv"
)

// appendMeta appends m's JSON encoding: byte for byte what json.Marshal
// makes of it (the field order, omitempty and string escaping of meta's
// tags), written without reflection. The committer encodes the metadata of
// every stream a group touches once per group (commit.go, groupMeta): with
// many streams each publishing a record or two, that is an encoding per
// record on every copy, and json.Marshal's reflection and allocations were
// a visible part of a broker's CPU. TestAppendMetaIsJSONMarshal holds the
// two encodings equal; decodeMeta still reads with encoding/json, so
// metadata written before this stays readable and this stays readable by
// badger's tools.
func appendMeta(b []byte, m *meta) []byte {
	b = append(b, '{')
	if m.Incarnation != "" {
		b = append(b, `"incarnation":`...)
		b = appendJSONString(b, m.Incarnation)
		b = append(b, ',')
	}
	b = appendUintField(b, `"epoch":`, m.Epoch)
	if len(m.LogEpochs) > 0 {
		b = append(b, `,"log_epochs":`...)
		b = appendLogEpochs(b, m.LogEpochs)
	}
	if m.SealEpoch != 0 {
		b = appendUintField(b, `,"seal_epoch":`, m.SealEpoch)
	}
	if m.SealTransition != "" {
		b = append(b, `,"seal_transition":`...)
		b = appendJSONString(b, m.SealTransition)
	}
	if len(m.SealedLogEpochs) > 0 {
		b = append(b, `,"sealed_log_epochs":`...)
		b = appendLogEpochs(b, m.SealedLogEpochs)
	}
	b = appendUintField(b, `,"head":`, m.Head)
	b = appendUintField(b, `,"head_chain":`, m.HeadChain)
	b = appendUintField(b, `,"purged":`, m.Purged)
	b = appendUintField(b, `,"record_tail":`, m.RecordTail)
	b = appendUintField(b, `,"chain":`, m.Chain)
	b = appendUintField(b, `,"cursor_event_tail":`, m.CursorEventTail)
	if m.CursorEventsPurged != 0 {
		b = appendUintField(b, `,"cursor_events_purged":`, m.CursorEventsPurged)
	}
	b = appendUintField(b, `,"bytes":`, m.Bytes)
	b = appendUintField(b, `,"confirm_watermark":`, m.ConfirmWatermark)
	if c := m.Cut; c != nil {
		b = appendUintField(b, `,"cut":{"record_tail":`, c.RecordTail)
		b = appendUintField(b, `,"cursor_event_tail":`, c.CursorEventTail)
		b = appendUintField(b, `,"chain":`, c.Chain)
		b = appendUintField(b, `,"bytes":`, c.Bytes)
		if c.ResetCursors {
			b = append(b, `,"reset_cursors":true`...)
		}
		b = append(b, '}')
	}
	if m.Dropping {
		b = append(b, `,"dropping":true`...)
	}
	if len(m.ProducerTables) > 0 {
		b = append(b, `,"producer_tables":[`...)
		for i, p := range m.ProducerTables {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendUintField(b, `{"gen":`, p.Gen)
			b = appendUintField(b, `,"boundary":`, p.Boundary)
			b = append(b, `,"chunks":`...)
			b = strconv.AppendInt(b, int64(p.Chunks), 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if m.ProducerGen != 0 {
		b = appendUintField(b, `,"producer_gen":`, m.ProducerGen)
	}
	if m.UnsureEpoch != 0 {
		b = appendUintField(b, `,"unsure_epoch":`, m.UnsureEpoch)
	}
	if m.TailsSeq != 0 {
		b = appendUintField(b, `,"tails_seq":`, m.TailsSeq)
	}
	return append(b, '}')
}

func appendUintField(b []byte, name string, v uint64) []byte {
	return strconv.AppendUint(append(b, name...), v, 10)
}

// appendLogEpochs writes LogEpoch values as json.Marshal does: it has no
// tags, so its field names are the Go ones.
func appendLogEpochs(b []byte, eps []LogEpoch) []byte {
	b = append(b, '[')
	for i, e := range eps {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendUintField(b, `{"Epoch":`, e.Epoch)
		b = appendUintField(b, `,"RecordStart":`, e.RecordStart)
		b = appendUintField(b, `,"CursorEventStart":`, e.CursorEventStart)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendJSONString writes s quoted. Printable ASCII that json.Marshal
// leaves alone (everything but quote, backslash and its HTML escapes) is
// copied; any other string goes through json.Marshal, so the rare odd
// name is escaped exactly as before.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
