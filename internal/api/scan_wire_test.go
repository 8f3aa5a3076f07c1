package api

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// randomScan is a scan result with the cases the encoding must get right:
// no items, empty keys, values and tags, versions of 0 and of every
// varint length, a next page or none.
func randomScan(rng *rand.Rand) kv.ScanResult {
	r := kv.ScanResult{Items: make([]kv.Record, rng.IntN(40))}
	if rng.IntN(2) == 0 {
		r.NextPage = fmt.Sprintf("page-%d", rng.Uint64())
	}
	if rng.IntN(4) > 0 {
		r.Version = rng.Uint64() >> rng.IntN(64)
	}
	for i := range r.Items {
		rec := &r.Items[i]
		rec.Key = make([]byte, rng.IntN(3)*rng.IntN(30))
		rec.Value = make([]byte, rng.IntN(3)*rng.IntN(300))
		for _, b := range [][]byte{rec.Key, rec.Value} {
			for j := range b {
				b[j] = byte(rng.IntN(256))
			}
		}
		for range rng.IntN(4) {
			rec.Tags = append(rec.Tags, fmt.Sprintf("%.*s", rng.IntN(6), "tagged"))
		}
		if rng.IntN(5) > 0 {
			rec.Version = rng.Uint64() >> rng.IntN(64)
		}
	}
	return r
}

// TestScanAnswerEncoding: a Pipeline answer carrying a scan as the unknown
// field appendScanAnswer encodes marshals to the bytes of the same answer
// built with ScanResultToPB, alone and in a batch, and decodes to it.
func TestScanAnswerEncoding(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for i := range 500 {
		res := randomScan(rng)
		id := rng.Uint64() >> rng.IntN(64)
		want := &pb.PipelineResponse{Id: id, Result: &pb.PipelineResponse_Scan{Scan: ScanResultToPB(res)}}
		got := &pb.PipelineResponse{Id: id}
		got.ProtoReflect().SetUnknown(appendScanAnswer(nil, res))
		for _, c := range []struct {
			name      string
			got, want proto.Message
		}{
			{"answer", got, want},
			{"batch", &pb.PipelineResponse{Batch: []*pb.PipelineResponse{got, got}}, &pb.PipelineResponse{Batch: []*pb.PipelineResponse{want, want}}},
		} {
			gb, err := proto.Marshal(c.got)
			if err != nil {
				t.Fatal(err)
			}
			wb, err := proto.Marshal(c.want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gb, wb) {
				t.Fatalf("scan %d (seed %d), %s: encoded\n%x\nwant\n%x", i, seed, c.name, gb, wb)
			}
			if proto.Size(c.got) != len(wb) {
				t.Fatalf("scan %d (seed %d), %s: Size %d, encoded %d bytes", i, seed, c.name, proto.Size(c.got), len(wb))
			}
		}
		var back pb.PipelineResponse
		b, _ := proto.Marshal(got)
		if err := proto.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&back, want) {
			t.Fatalf("scan %d (seed %d): decoded %v, want %v", i, seed, &back, want)
		}
	}
}

// TestScanAnswerCoversResult fails when kv.ScanResult or kv.Record gains
// a field: appendScanAnswer encodes each field by hand, and randomScan
// must fill a new one for TestScanAnswerEncoding to compare it.
func TestScanAnswerCoversResult(t *testing.T) {
	for _, c := range []struct {
		typ  reflect.Type
		want []string
	}{
		{reflect.TypeFor[kv.ScanResult](), []string{"Items", "NextPage", "Version"}},
		{reflect.TypeFor[kv.Record](), []string{"Key", "Value", "Tags", "Version"}},
	} {
		var got []string
		for f := range c.typ.Fields() {
			got = append(got, f.Name)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s has fields %v; appendScanAnswer and randomScan handle %v: extend them", c.typ, got, c.want)
		}
	}
}

// BenchmarkScanAnswer encodes the Pipeline answer of a scan of 50
// records of 100 bytes both ways: a message per record marshaled by
// protobuf's reflection, and appendScanAnswer.
func BenchmarkScanAnswer(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	res := kv.ScanResult{Version: 1 << 40, Items: make([]kv.Record, 50)}
	for i := range res.Items {
		res.Items[i] = kv.Record{Key: fmt.Appendf(nil, "user%08d", rng.IntN(1e8)), Value: make([]byte, 100), Version: rng.Uint64() >> 20}
	}
	b.Run("messages", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m := &pb.PipelineResponse{Id: 7, Result: &pb.PipelineResponse_Scan{Scan: ScanResultToPB(res)}}
			d, err := (Codec{}).Marshal(m)
			if err != nil {
				b.Fatal(err)
			}
			d.Free()
		}
	})
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m := &pb.PipelineResponse{Id: 7}
			m.ProtoReflect().SetUnknown(appendScanAnswer(nil, res))
			d, err := (Codec{}).Marshal(m)
			if err != nil {
				b.Fatal(err)
			}
			d.Free()
		}
	})
}
