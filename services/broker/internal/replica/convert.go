package replica

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/services/broker/internal/storage"
)

// ToProto converts a stored record for the wire.
func ToProto(r storage.Record) *strandv1.StoredRecord {
	return &strandv1.StoredRecord{
		Offset:      r.Offset,
		Epoch:       r.Epoch,
		Payload:     r.Payload,
		Headers:     r.Headers,
		PublishTime: timestamppb.New(r.PublishTime),
		ProducerId:  r.ProducerID,
		Sequence:    r.Sequence,
		Chain:       r.Chain,
	}
}

func eventToProto(e storage.CursorEvent) *strandv1.CursorEvent {
	return &strandv1.CursorEvent{Offset: e.Offset, Epoch: e.Epoch, Cursor: e.Cursor, Position: e.Position}
}

func eventFromProto(e *strandv1.CursorEvent) storage.CursorEvent {
	return storage.CursorEvent{Offset: e.GetOffset(), Epoch: e.GetEpoch(), Cursor: e.GetCursor(), Position: e.GetPosition()}
}

// LogEpochsToProto converts log epochs for the wire.
func LogEpochsToProto(les []storage.LogEpoch) []*strandv1.LogEpoch {
	out := make([]*strandv1.LogEpoch, 0, len(les))
	for _, le := range les {
		out = append(out, &strandv1.LogEpoch{Epoch: le.Epoch, RecordStart: le.RecordStart, CursorEventStart: le.CursorEventStart})
	}
	return out
}
