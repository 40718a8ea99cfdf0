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
	record := fmt.Errorf("%w: record 1 of 4194400 bytes above the 1258291-byte limit", storage.ErrInvalidArgument)
	err = publishError(record)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "records: storage: invalid argument: record 1 of 4194400 bytes above the 1258291-byte limit") {
		t.Errorf("publishError(%v) = %v, want resource_exhausted naming records, with the message", record, err)
	}
	// Everything else in a publish maps as anywhere.
	if err := publishError(storage.ErrSealed); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("publishError(%v) = %v, want unavailable", storage.ErrSealed, err)
	}
}
