package api

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
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
// a field: appendScanAnswer and DecodeScanBytes handle each field by
// hand, and randomScan must fill a new one for the encoding tests to
// compare it.
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
			t.Errorf("%s has fields %v; appendScanAnswer, DecodeScanBytes and randomScan handle %v: extend them", c.typ, got, c.want)
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

// TestScanBytesEncoding: the answer scanBytes builds record by record is
// the bytes protobuf marshals ScanResultToPB of the same scan to, and
// DecodeScanBytes decodes those bytes (and a ScanResponse with a field it
// does not read) to what ScanResultFromPB converts them to.
func TestScanBytesEncoding(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for i := range 500 {
		res := randomScan(rng)
		e := scanBytes{limit: rng.IntN(3) * rng.IntN(200)} // room reserved for 0 to 398 records
		for j := range res.Items {
			e.add(&res.Items[j])
		}
		got := e.finish(kv.ScanResult{NextPage: res.NextPage, Version: res.Version})
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(ScanResultToPB(res))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("scan %d (seed %d): encoded\n%x\nwant\n%x", i, seed, got, want)
		}
		m := ScanResultToPB(res)
		if rng.IntN(2) == 0 {
			m.Txn = "txn-id" // a field kv.ScanResult does not hold
		}
		enc, _ := proto.Marshal(m)
		var back pb.ScanResponse
		if err := proto.Unmarshal(enc, &back); err != nil {
			t.Fatal(err)
		}
		dec, err := DecodeScanBytes(enc)
		if err != nil {
			t.Fatalf("scan %d (seed %d): %v", i, seed, err)
		}
		if w := ScanResultFromPB(&back); !reflect.DeepEqual(dec, w) {
			t.Fatalf("scan %d (seed %d): decoded\n%+v\nwant\n%+v", i, seed, dec, w)
		}
	}
}

// TestDecodeScanBytesMalformed: every prefix of an encoded answer, and
// the answer with a byte changed, decodes as protobuf decodes it: an
// error where protobuf fails, the same result where it does not, and
// never a panic.
func TestDecodeScanBytesMalformed(t *testing.T) {
	rng := testRand(t)
	check := func(i int, b []byte) {
		t.Helper()
		var m pb.ScanResponse
		perr := proto.Unmarshal(b, &m)
		got, err := DecodeScanBytes(b)
		switch {
		case (perr == nil) != (err == nil):
			t.Fatalf("scan %d, bytes %x: protobuf %v, DecodeScanBytes %v", i, b, perr, err)
		case err == nil && !reflect.DeepEqual(got, ScanResultFromPB(&m)):
			t.Fatalf("scan %d, bytes %x: decoded %+v, protobuf %+v", i, b, got, ScanResultFromPB(&m))
		case err != nil && kv.CodeOf(err) != kv.CodeInternal:
			t.Fatalf("scan %d: error %v, want code internal", i, err)
		}
	}
	for i := range 100 {
		res := randomScan(rng)
		enc, _ := proto.Marshal(ScanResultToPB(res))
		for n := range len(enc) {
			check(i, enc[:n])
		}
		if len(enc) > 0 {
			for range 50 {
				b := slices.Clone(enc)
				b[rng.IntN(len(b))] = byte(rng.IntN(256))
				check(i, b)
			}
		}
	}
}

// TestDecodeScanBytesFieldNumbers: an unknown field whose number is past
// protobuf's largest, 2^29-1 (which protowire.ConsumeTag allows, for
// MessageSets), makes the answer malformed, as protobuf has it, at the top
// and in a record; one at the largest is skipped. (A byte changed by
// TestDecodeScanBytesMalformed, seed 1952827221151954535, made one.)
func TestDecodeScanBytesFieldNumbers(t *testing.T) {
	unknown := func(num protowire.Number) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), 1)
	}
	inRecord := func(field []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, fieldScanItems, protowire.BytesType), field)
	}
	for _, tc := range []struct {
		b  []byte
		ok bool
	}{
		{unknown(protowire.MaxValidNumber), true},
		{inRecord(unknown(protowire.MaxValidNumber)), true},
		{unknown(protowire.MaxValidNumber + 1), false},
		{inRecord(unknown(protowire.MaxValidNumber + 1)), false},
	} {
		var m pb.ScanResponse
		if perr := proto.Unmarshal(tc.b, &m); (perr == nil) != tc.ok {
			t.Fatalf("%x: protobuf %v, the test expects ok %v", tc.b, perr, tc.ok)
		}
		_, err := DecodeScanBytes(tc.b)
		if tc.ok && err != nil || !tc.ok && (err == nil || kv.CodeOf(err) != kv.CodeInternal) {
			t.Errorf("%x: DecodeScanBytes %v, want ok %v", tc.b, err, tc.ok)
		}
	}
}

// BenchmarkScanBytesDecode decodes the answer of a scan of 50 records of
// 100 bytes both ways: protobuf into a message per record, converted by
// ScanResultFromPB, and DecodeScanBytes.
func BenchmarkScanBytesDecode(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	res := kv.ScanResult{Version: 1 << 40, Items: make([]kv.Record, 50)}
	for i := range res.Items {
		res.Items[i] = kv.Record{Key: fmt.Appendf(nil, "user%08d", rng.IntN(1e8)), Value: make([]byte, 100), Version: rng.Uint64() >> 20}
	}
	enc, _ := proto.Marshal(ScanResultToPB(res))
	b.Run("messages", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m pb.ScanResponse
			if err := proto.Unmarshal(enc, &m); err != nil {
				b.Fatal(err)
			}
			_ = ScanResultFromPB(&m)
		}
	})
	b.Run("DecodeScanBytes", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeScanBytes(enc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
