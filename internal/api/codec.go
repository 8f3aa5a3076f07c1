package api

import (
	"fmt"
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// Codec is gRPC's protobuf codec ("proto", the same wire format) with one
// difference: the buffers it marshals messages into, and gathers a
// message's frames into before unmarshaling it, come from a pool that does
// not zero them. gRPC's default pool clears the whole capacity of a buffer
// on every Get: under scans, whose answers run to tens of KiB, that was a
// twentieth of the server's CPU and a tenth of the benchmark client's.
// Nothing reads such a buffer past what was written into it: a message is
// marshaled over its first Size bytes, and the frames are copied over all
// of it.
//
// The server uses it for the GroupKV service (NewGRPCServer), the Go client
// for its calls (CodecCallOption). Either side talks to a peer using gRPC's
// own codec as before.
type Codec struct{}

// CodecCallOption makes a client connection's calls use Codec.
func CodecCallOption() grpc.CallOption { return grpc.ForceCodecV2(Codec{}) }

// Name is the content-subtype of gRPC's protobuf codec.
func (Codec) Name() string { return "proto" }

// Marshal marshals v into one buffer: from the pool when it is larger than
// gRPC pools, else a buffer of its own.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("proto: cannot marshal %T, want proto.Message", v)
	}
	size := proto.Size(m)
	// UseCachedSize reuses what Size just computed; the message is not
	// changed meanwhile.
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := codecPool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		codecPool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, codecPool)}, nil
}

// Unmarshal unmarshals data into v. A message that came in several frames
// is copied into one buffer first; proto.Unmarshal copies what it keeps.
// A Pipeline stream's request or answer is decoded by
// decodePipelineRequest or decodePipelineResponse when it takes it, into
// the same message.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("proto: cannot unmarshal into %T, want proto.Message", v)
	}
	buf := data.MaterializeToBuffer(codecPool)
	defer buf.Free()
	switch m := m.(type) {
	case *pb.PipelineRequest:
		if decodePipelineRequest(buf.ReadOnlyData(), m) {
			return nil
		}
	case *pb.PipelineResponse:
		if decodePipelineResponse(buf.ReadOnlyData(), m) {
			return nil
		}
	}
	return proto.Unmarshal(buf.ReadOnlyData(), m) // (it resets m first)
}

// dirtyPool is a mem.BufferPool of power-of-two buffers from 1 KiB to
// 1 MiB whose Get does not clear them. A larger buffer is allocated and
// left to the garbage collector.
type dirtyPool struct {
	tiers [dirtyTiers]sync.Pool
}

const (
	dirtyMinShift = 10 // 1 KiB
	dirtyTiers    = 11 // up to 1 MiB
)

var codecPool = &dirtyPool{}

// dirtyTier is the tier whose buffers hold n bytes, or -1 past the largest.
func dirtyTier(n int) int {
	t := 0
	if n > 1<<dirtyMinShift {
		t = bits.Len(uint(n-1)) - dirtyMinShift
	}
	if t >= dirtyTiers {
		return -1
	}
	return t
}

// Get returns a buffer of length n, its bytes as a previous user left them.
func (p *dirtyPool) Get(n int) *[]byte {
	t := dirtyTier(n)
	if t < 0 {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(t+dirtyMinShift))
	return &b
}

// Put takes back a buffer that Get returned (or a prefix of one).
func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	t := dirtyTier(c)
	if t < 0 || c != 1<<(t+dirtyMinShift) {
		return // not one of the pool's
	}
	p.tiers[t].Put(b)
}
