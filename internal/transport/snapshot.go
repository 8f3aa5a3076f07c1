package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv/internal/replication"
)

// Raft snapshots larger than one batch do not travel on the message
// stream: each goes on a stream of its own, in chunks of MaxBatchBytes,
// so that neither side holds one huge gRPC message and the node's other
// raft traffic is not stuck behind it. The stream's first frame is a
// header — the shard id, the data's length and the raft message without
// its data — and the others are the data, in order; the receiver
// reassembles the message and hands it to its Host once all of it arrived,
// then answers with an empty frame.
const (
	snapshotService = "groupkv.raft.v1.Snapshots"
	snapshotMethod  = "/" + snapshotService + "/Send"
	rawCodecName    = "groupkv-raw"
	// maxSnapshotBytes bounds the data of one snapshot a node accepts.
	maxSnapshotBytes = 8 << 30
)

// frame is one raw frame of a snapshot stream.
type frame struct{ b []byte }

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("transport: raw codec cannot marshal %T", v)
	}
	return f.b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("transport: raw codec cannot unmarshal into %T", v)
	}
	f.b = append(f.b[:0], data...)
	return nil
}

func (rawCodec) Name() string { return rawCodecName }

func init() { encoding.RegisterCodec(rawCodec{}) }

var snapshotStreamDesc = grpc.StreamDesc{StreamName: "Send", ClientStreams: true}

// streamSnapshot sends m, a MsgSnap, to the node at addr on a stream of
// its own, and reports the outcome.
func (t *GRPC) streamSnapshot(addr string, m replication.Message) {
	err := t.sendSnapshot(addr, m)
	if err == nil {
		t.streamed.Add(1)
	}
	if err != nil {
		t.dropped.Add(1)
		t.opts.Logger.Warn("raft transport: sending a snapshot failed", "shard", m.ShardID, "to", m.Msg.To, "addr", addr, "err", err)
	}
	if t.opts.SnapshotSent != nil {
		t.opts.SnapshotSent(m.ShardID, m.Msg.To, err == nil)
	}
}

func (t *GRPC) sendSnapshot(addr string, m replication.Message) error {
	data := m.Msg.Snapshot.Data
	head := m.Msg
	snap := *m.Msg.Snapshot
	snap.Data = nil
	head.Snapshot = &snap
	hb, err := head.Marshal()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addr, t.opts.DialOptions(addr)...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	stream, err := conn.NewStream(ctx, &snapshotStreamDesc, snapshotMethod, grpc.CallContentSubtype(rawCodecName))
	if err != nil {
		return err
	}
	header := binary.BigEndian.AppendUint64(nil, m.ShardID)
	header = binary.BigEndian.AppendUint64(header, uint64(len(data)))
	if err := stream.SendMsg(&frame{append(header, hb...)}); err != nil {
		return err
	}
	chunk := t.opts.MaxBatchBytes
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		if err := stream.SendMsg(&frame{data[off:end]}); err != nil {
			return err
		}
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	var ack frame
	return stream.RecvMsg(&ack)
}

// registerSnapshots registers the receiving side of snapshot streams.
func registerSnapshots(s grpc.ServiceRegistrar, deliver func(replication.Message)) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: snapshotService,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Send",
			ClientStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				return receiveSnapshot(stream, deliver)
			},
		}},
	}, struct{}{})
}

func receiveSnapshot(stream grpc.ServerStream, deliver func(replication.Message)) error {
	var f frame
	if err := stream.RecvMsg(&f); err != nil {
		return err
	}
	if len(f.b) < 16 {
		return status.Errorf(codes.InvalidArgument, "transport: snapshot header of %d bytes", len(f.b))
	}
	shardID := binary.BigEndian.Uint64(f.b)
	size := binary.BigEndian.Uint64(f.b[8:])
	var m raftpb.Message
	if err := m.Unmarshal(f.b[16:]); err != nil || m.Type != raftpb.MsgSnap || m.Snapshot == nil {
		return status.Errorf(codes.InvalidArgument, "transport: snapshot header of shard %d is not a snapshot message: %v", shardID, err)
	}
	if size > maxSnapshotBytes {
		return status.Errorf(codes.ResourceExhausted, "transport: a snapshot of %d bytes is over the %d limit", size, maxSnapshotBytes)
	}
	data := make([]byte, 0, size)
	for {
		f.b = f.b[:0]
		err := stream.RecvMsg(&f)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if uint64(len(data)+len(f.b)) > size {
			return status.Errorf(codes.InvalidArgument, "transport: snapshot of shard %d is longer than its header says (%d)", shardID, size)
		}
		data = append(data, f.b...)
	}
	if uint64(len(data)) != size {
		return status.Errorf(codes.InvalidArgument, "transport: snapshot of shard %d ended at %d of %d bytes", shardID, len(data), size)
	}
	m.Snapshot.Data = data
	deliver(replication.Message{ShardID: shardID, Msg: m})
	return stream.SendMsg(&frame{})
}
