package api

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // gRPC's own codec, to compare with
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// scanAnswer is a Pipeline answer carrying a scan of n records of size
// bytes each, their contents drawn from rng.
func scanAnswer(rng *rand.Rand, id uint64, n, size int) *pb.PipelineResponse {
	items := make([]*pb.Record, n)
	for i := range items {
		v := make([]byte, size)
		for j := range v {
			v[j] = byte(rng.IntN(256))
		}
		items[i] = &pb.Record{Key: fmt.Appendf(nil, "user%08d", rng.IntN(1e8)), Value: v, Version: rng.Uint64(), Tags: []string{"t"}}
	}
	return &pb.PipelineResponse{Id: id, Result: &pb.PipelineResponse_Scan{Scan: &pb.ScanResponse{Items: items, Version: rng.Uint64()}}}
}

// split cuts b into pieces of at most frame bytes, as a message read from
// several HTTP/2 frames arrives.
func split(b []byte, frame int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(frame, len(b))
		s = append(s, mem.SliceBuffer(bytes.Clone(b[:n])))
		b = b[n:]
	}
	return s
}

// TestCodecReusedBuffers marshals and unmarshals messages of sizes across
// the pool's tiers (and past them), larger and smaller ones in turn, so
// that each reuses buffers a larger message left its bytes in; every
// message must come back equal, and encode as gRPC's own codec encodes it.
func TestCodecReusedBuffers(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	std := encoding.GetCodecV2("proto")
	var c Codec
	sizes := []int{0, 1, 3, 40, 400, 2000, 9000}
	for i := range 300 {
		want := scanAnswer(rng, uint64(i), rng.IntN(120), sizes[rng.IntN(len(sizes))])
		got, err := c.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := std.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), ref.Materialize()) {
			t.Fatalf("message %d (seed %d): Codec's encoding differs from gRPC's", i, seed)
		}
		in := split(got.Materialize(), 1+rng.IntN(20000))
		got.Free()
		ref.Free()
		var back pb.PipelineResponse
		if err := c.Unmarshal(in, &back); err != nil {
			t.Fatalf("message %d (seed %d): %v", i, seed, err)
		}
		in.Free()
		if !proto.Equal(want, &back) {
			t.Fatalf("message %d (seed %d): came back changed", i, seed)
		}
	}
}

func TestCodecRefusesOtherTypes(t *testing.T) {
	var c Codec
	if _, err := c.Marshal("not a message"); err == nil {
		t.Fatal("Marshal of a string: no error")
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{1})}, new(int)); err == nil {
		t.Fatal("Unmarshal into an int: no error")
	}
}

func TestDirtyPoolTiers(t *testing.T) {
	for _, tc := range []struct{ n, tier int }{
		{0, 0}, {1, 0}, {1024, 0}, {1025, 1}, {2048, 1}, {2049, 2}, {16 << 10, 4}, {1 << 20, 10}, {1<<20 + 1, -1},
	} {
		if got := dirtyTier(tc.n); got != tc.tier {
			t.Errorf("dirtyTier(%d) = %d, want %d", tc.n, got, tc.tier)
		}
	}
	p := &dirtyPool{}
	b := p.Get(3000)
	if len(*b) != 3000 || cap(*b) != 4096 {
		t.Fatalf("Get(3000): len %d cap %d, want 3000 and 4096", len(*b), cap(*b))
	}
	p.Put(b)
	big := p.Get(2 << 20)
	if len(*big) != 2<<20 {
		t.Fatalf("Get(2 MiB): len %d", len(*big))
	}
	p.Put(big) // not the pool's: dropped
	odd := make([]byte, 100, 3000)
	p.Put(&odd) // not a tier's size: dropped
}

// BenchmarkCodec marshals and unmarshals Pipeline messages carrying scans'
// answers of 50 records of 100 bytes each (as under YCSB E) with Codec and
// with gRPC's own codec: one answer (about 8 KiB), and a batch of six
// (about 50 KiB: the answers ready together go in one message). The
// server marshals, the client unmarshals from 16 KiB frames.
func BenchmarkCodec(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	one := scanAnswer(rng, 1, 50, 100)
	batch := &pb.PipelineResponse{}
	for i := range 6 {
		batch.Batch = append(batch.Batch, scanAnswer(rng, uint64(i), 50, 100))
	}
	for _, m := range []struct {
		name string
		msg  *pb.PipelineResponse
	}{{"one", one}, {"batch6", batch}} {
		for _, c := range []encoding.CodecV2{encoding.GetCodecV2("proto"), Codec{}} {
			name := "grpc"
			if _, ok := c.(Codec); ok {
				name = "groupkv"
			}
			benchCodec(b, m.name+"/"+name, c, m.msg)
		}
	}
}

func benchCodec(b *testing.B, name string, c encoding.CodecV2, msg *pb.PipelineResponse) {
	raw, err := proto.Marshal(msg)
	if err != nil {
		b.Fatal(err)
	}
	{
		b.Run("marshal/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d, err := c.Marshal(msg)
				if err != nil {
					b.Fatal(err)
				}
				d.Free()
			}
		})
		b.Run("unmarshal/"+name, func(b *testing.B) {
			in := split(raw, 16<<10)
			b.ReportAllocs()
			for b.Loop() {
				var m pb.PipelineResponse
				if err := c.Unmarshal(in, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
