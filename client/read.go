package client

import (
	"context"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
)

// Read returns confirmed records of req.Stream from req.FromOffset, bounded
// by req.MaxRecords and req.MaxBytes (0 means the broker's default).
func (c *Client) Read(ctx context.Context, req *strandv1.ReadRequest) (*strandv1.ReadResponse, error) {
	var out *strandv1.ReadResponse
	err := c.call(ctx, "read", req.GetStream(), func(ctx context.Context, sc *brokerConn) error {
		res, err := sc.Read(ctx, connect.NewRequest(req))
		if err == nil {
			out = res.Msg
		}
		return err
	})
	return out, err
}

// CommitCursor moves the named cursor of stream to offset, its next
// unsettled offset. Retrying a commit is harmless: cursors only move forward.
func (c *Client) CommitCursor(ctx context.Context, stream, cursor string, offset uint64) (*strandv1.CommitCursorResponse, error) {
	var out *strandv1.CommitCursorResponse
	err := c.call(ctx, "commit cursor", stream, func(ctx context.Context, sc *brokerConn) error {
		res, err := sc.CommitCursor(ctx, connect.NewRequest(&strandv1.CommitCursorRequest{Stream: stream, Cursor: cursor, Offset: offset}))
		if err == nil {
			out = res.Msg
		}
		return err
	})
	return out, err
}

// GetCursor returns the named cursor's next unsettled offset.
func (c *Client) GetCursor(ctx context.Context, stream, cursor string) (*strandv1.GetCursorResponse, error) {
	var out *strandv1.GetCursorResponse
	err := c.call(ctx, "get cursor", stream, func(ctx context.Context, sc *brokerConn) error {
		res, err := sc.GetCursor(ctx, connect.NewRequest(&strandv1.GetCursorRequest{Stream: stream, Cursor: cursor}))
		if err == nil {
			out = res.Msg
		}
		return err
	})
	return out, err
}
