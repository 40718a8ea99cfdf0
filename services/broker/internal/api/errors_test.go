package api

import (
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/strandhq/strand/services/broker/internal/storage"
)

// Input storage refuses is the client's mistake, not an internal error:
// its code says so and its message, which names what and the bound, is
// kept. In a publish it is a record too large for storage.
func TestStorageInvalidArgumentIsTheClients(t *testing.T) {
	cursor := fmt.Errorf("%w: cursor name of 300 bytes (want 1..256)", storage.ErrInvalidArgument)
	err := toConnect(cursor)
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "cursor name of 300 bytes (want 1..256)") {
		t.Errorf("toConnect(%v) = %v, want invalid_argument with the message", cursor, err)
	}
	record := fmt.Errorf("%w: record 1 of 4194400 bytes above the 1258291-byte limit", storage.ErrTooLarge)
	err = toConnect(record)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "records: storage: invalid argument: record too large: record 1 of 4194400 bytes above the 1258291-byte limit") {
		t.Errorf("toConnect(%v) = %v, want resource_exhausted naming records, with the message", record, err)
	}
	// An oversized producer id is invalid, not too large; the rest maps as
	// anywhere.
	producer := fmt.Errorf("%w: record 0: producer id of 300 bytes above the 256-byte limit", storage.ErrInvalidArgument)
	if err := toConnect(producer); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("toConnect(%v) = %v, want invalid_argument", producer, err)
	}
	if err := toConnect(storage.ErrSealed); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("toConnect(%v) = %v, want unavailable", storage.ErrSealed, err)
	}
}
