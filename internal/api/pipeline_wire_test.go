package api

import (
	"bytes"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// testRand is a generator seeded with GROUPKV_SEED, or a random seed;
// logged either way.
func testRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv("GROUPKV_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GROUPKV_SEED=%q is not an unsigned integer: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with GROUPKV_SEED=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, 0))
}

func randBytes(rng *rand.Rand, max int) []byte {
	if rng.IntN(4) == 0 {
		return nil
	}
	b := make([]byte, rng.IntN(max+1))
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

func randCollection(rng *rand.Rand) string {
	return []string{"", "c", "users", "a-long-collection-name", "é"}[rng.IntN(5)]
}

// randPipelineOp is a random request of a Pipeline stream, without a batch.
func randPipelineOp(rng *rand.Rand) *pb.PipelineRequest {
	r := &pb.PipelineRequest{Id: rng.Uint64() >> rng.UintN(64)}
	if rng.IntN(3) == 0 {
		r.TimeoutMicros = rng.Uint64N(1 << 40)
	}
	maybeVersion := func() *uint64 {
		if rng.IntN(3) > 0 {
			return nil
		}
		v := rng.Uint64N(1000)
		return &v
	}
	switch rng.IntN(7) {
	case 0, 1:
		p := &pb.PutRequest{Collection: randCollection(rng), Key: randBytes(rng, 20), Value: randBytes(rng, 300), IfVersion: maybeVersion()}
		for range rng.IntN(3) {
			p.Tags = append(p.Tags, []string{"", "t", "tag-2"}[rng.IntN(3)])
		}
		r.Op = &pb.PipelineRequest_Put{Put: p}
	case 2, 3:
		r.Op = &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: randCollection(rng), Key: randBytes(rng, 20), Version: rng.Uint64N(3)}}
	case 4:
		r.Op = &pb.PipelineRequest_Delete{Delete: &pb.DeleteRequest{Collection: randCollection(rng), Key: randBytes(rng, 20), IfVersion: maybeVersion()}}
	case 5:
		r.Op = &pb.PipelineRequest_Scan{Scan: &pb.ScanRequest{Collection: randCollection(rng), Limit: int64(rng.IntN(100))}}
	case 6:
		if rng.IntN(2) == 0 {
			r.Op = &pb.PipelineRequest_TxnGet{TxnGet: &pb.TxnGetRequest{Txn: "t1", Collection: randCollection(rng), Key: randBytes(rng, 10)}}
		} else {
			r.Op = &pb.PipelineRequest_CommitTxn{CommitTxn: &pb.CommitTxnRequest{Txn: "t2"}}
		}
	}
	if rng.IntN(10) == 0 {
		r.Op = nil
	}
	return r
}

// randPipelineRequest is a random message of a Pipeline stream: a request,
// or a carrier of a batch of them.
func randPipelineRequest(rng *rand.Rand) *pb.PipelineRequest {
	if rng.IntN(3) == 0 {
		return randPipelineOp(rng)
	}
	m := &pb.PipelineRequest{}
	for range 1 + rng.IntN(20) {
		m.Batch = append(m.Batch, randPipelineOp(rng))
	}
	return m
}

// TestDecodePipelineRequestMatchesProto: every message a client sends is
// decoded by decodePipelineRequest, into what proto.Unmarshal makes of it.
func TestDecodePipelineRequestMatchesProto(t *testing.T) {
	checkDecodeMatches(t, randPipelineRequest, decodePipelineRequest)
}

// checkDecodeMatches is TestDecodePipelineRequestMatchesProto for the
// messages gen makes and decode decodes.
func checkDecodeMatches[T any, M interface {
	*T
	proto.Message
}](t *testing.T, gen func(*rand.Rand) M, decode func([]byte, M) bool) {
	rng := testRand(t)
	for i := range 2000 {
		want := gen(rng)
		b, err := proto.MarshalOptions{Deterministic: rng.IntN(2) == 0}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got := M(new(T))
		if !decode(b, got) {
			t.Fatalf("message %d: not decoded: %v", i, want)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("message %d: decoded\n%v\nwant\n%v", i, got, want)
		}
	}
}

// mutate changes the encoded message b at random: cut short, bytes
// changed, or a field appended.
func mutate(rng *rand.Rand, b []byte) []byte {
	switch rng.IntN(3) {
	case 0:
		b = b[:rng.IntN(len(b))]
	case 1:
		for range 1 + rng.IntN(3) {
			b[rng.IntN(len(b))] = byte(rng.UintN(256))
		}
	case 2:
		b = protowire.AppendTag(b, protowire.Number(1+rng.IntN(12)), protowire.Type(rng.IntN(6)))
		b = append(b, randBytes(rng, 3)...)
	}
	return b
}

// TestDecodePipelineRequestMalformed: a message changed at random is
// either decoded as proto.Unmarshal decodes it, or left to proto.Unmarshal;
// the codec answers what proto.Unmarshal answers either way.
func TestDecodePipelineRequestMalformed(t *testing.T) {
	checkDecodeMalformed(t, randPipelineRequest, decodePipelineRequest)
}

// checkDecodeMalformed is TestDecodePipelineRequestMalformed for the
// messages gen makes and decode decodes.
func checkDecodeMalformed[T any, M interface {
	*T
	proto.Message
}](t *testing.T, gen func(*rand.Rand) M, decode func([]byte, M) bool) {
	rng := testRand(t)
	decoded := 0
	for i := range 20000 {
		b, err := proto.Marshal(gen(rng))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			continue
		}
		b = mutate(rng, b)
		want, got, viaCodec := M(new(T)), M(new(T)), M(new(T))
		perr := proto.Unmarshal(b, want)
		if decode(b, got) {
			decoded++
			if perr != nil {
				t.Fatalf("message %d (%x): decoded, proto.Unmarshal fails: %v", i, b, perr)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("message %d (%x): decoded\n%v\nproto.Unmarshal\n%v", i, b, got, want)
			}
		}
		cerr := Codec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, viaCodec)
		if (cerr == nil) != (perr == nil) {
			t.Fatalf("message %d (%x): codec error %v, proto.Unmarshal's %v", i, b, cerr, perr)
		}
		if perr == nil && !proto.Equal(viaCodec, want) {
			t.Fatalf("message %d (%x): codec decoded\n%v\nproto.Unmarshal\n%v", i, b, viaCodec, want)
		}
	}
	t.Logf("%d changed messages decoded by hand", decoded)
}

// TestDecodePipelineRequestLeftToProto: what the hand decoder does not
// take goes to proto.Unmarshal, which keeps unknown fields, merges an op
// set twice and refuses a string that is not UTF-8.
func TestDecodePipelineRequestLeftToProto(t *testing.T) {
	put := func(coll string) []byte {
		var p []byte
		p = protowire.AppendTag(p, fieldPutCollection, protowire.BytesType)
		p = protowire.AppendString(p, coll)
		p = protowire.AppendTag(p, fieldPutKey, protowire.BytesType)
		p = protowire.AppendBytes(p, []byte("k"))
		return p
	}
	field := func(b []byte, num protowire.Number, v []byte) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendBytes(b, v)
	}
	unknown := protowire.AppendVarint(protowire.AppendTag(nil, 15, protowire.VarintType), 1)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"unknown field", append(field(nil, fieldPipelineRequestPut, put("c")), unknown...)},
		{"unknown field in a put", field(nil, fieldPipelineRequestPut, append(put("c"), unknown...))},
		{"id of the wrong wire type", field(field(nil, fieldPipelineRequestPut, put("c")), fieldPipelineRequestID, []byte("x"))},
		{"op twice", field(field(nil, fieldPipelineRequestPut, put("c")), fieldPipelineRequestPut, put("d"))},
		{"op twice in a batch item", field(nil, fieldPipelineRequestBatch, field(field(nil, fieldPipelineRequestPut, put("c")), fieldPipelineRequestGet, put("d")))},
		{"collection not UTF-8", field(nil, fieldPipelineRequestPut, put("\xff"))},
		{"batch in a batch", field(nil, fieldPipelineRequestBatch, field(nil, fieldPipelineRequestBatch, field(nil, fieldPipelineRequestPut, put("c"))))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got pb.PipelineRequest
			if decodePipelineRequest(tc.b, &got) {
				t.Fatalf("decoded by hand: %v", &got)
			}
			var want, viaCodec pb.PipelineRequest
			perr := proto.Unmarshal(tc.b, &want)
			cerr := Codec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.b)}, &viaCodec)
			if (cerr == nil) != (perr == nil) || (perr == nil && !proto.Equal(&viaCodec, &want)) {
				t.Fatalf("codec: %v %v, proto.Unmarshal: %v %v", &viaCodec, cerr, &want, perr)
			}
		})
	}
}

// TestDecodePipelineRequestCopies: what the hand decoder returns holds
// none of the buffer it decoded (gRPC reuses it), and a request's key and
// value, which share an allocation, do not overlap.
func TestDecodePipelineRequestCopies(t *testing.T) {
	want := &pb.PipelineRequest{Batch: []*pb.PipelineRequest{
		{Id: 1, Op: &pb.PipelineRequest_Put{Put: &pb.PutRequest{Collection: "c", Key: []byte("key"), Value: []byte("value"), Tags: []string{"t"}}}},
		{Id: 2, Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: "c", Key: []byte("key2")}}},
		{Id: 3, Op: &pb.PipelineRequest_Delete{Delete: &pb.DeleteRequest{Collection: "d", Key: []byte("key3")}}},
	}}
	b, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got pb.PipelineRequest
	if !decodePipelineRequest(b, &got) {
		t.Fatal("not decoded")
	}
	clear(b)
	if !proto.Equal(&got, want) {
		t.Fatalf("after the buffer was cleared: %v, want %v", &got, want)
	}
	p := got.Batch[0].GetPut()
	p.Key = append(p.Key, "more"...)
	if !bytes.Equal(p.Value, []byte("value")) {
		t.Fatalf("appending to the key changed the value: %q", p.Value)
	}
}

// randPipelineResult is a random answer of a Pipeline stream, without a
// batch.
func randPipelineResult(rng *rand.Rand) *pb.PipelineResponse {
	r := &pb.PipelineResponse{Id: rng.Uint64() >> rng.UintN(64)}
	switch rng.IntN(9) {
	case 0, 1:
		r.Result = &pb.PipelineResponse_Put{Put: &pb.PutResponse{Version: rng.Uint64N(1 << 40)}}
	case 2, 3:
		g := &pb.GetResponse{Key: randBytes(rng, 20), Value: randBytes(rng, 300), Version: rng.Uint64N(1 << 40)}
		for range rng.IntN(3) {
			g.Tags = append(g.Tags, []string{"", "t", "tag-2"}[rng.IntN(3)])
		}
		r.Result = &pb.PipelineResponse_Get{Get: g}
	case 4:
		r.Result = &pb.PipelineResponse_Delete{Delete: &pb.DeleteResponse{Version: rng.Uint64N(3)}}
	case 5:
		r.Result = &pb.PipelineResponse_Error{Error: &pb.PipelineError{Code: []string{"", "not_found", "txn_aborted"}[rng.IntN(3)], Message: "m é", GrpcCode: uint32(rng.IntN(17)), Txn: []string{"", "t1"}[rng.IntN(2)]}}
	case 6:
		r.Result = &pb.PipelineResponse_ScanBytes{ScanBytes: randBytes(rng, 50)}
	case 7:
		r.Result = &pb.PipelineResponse_Scan{Scan: &pb.ScanResponse{Items: []*pb.Record{{Key: []byte("k"), Value: randBytes(rng, 10)}}, NextPage: "p", Version: 3}}
	case 8:
		if rng.IntN(2) == 0 {
			r.Result = &pb.PipelineResponse_TxnGet{TxnGet: &pb.TxnGetResponse{Found: true, Value: randBytes(rng, 10), Version: 4, Txn: "t"}}
		} else {
			r.Result = &pb.PipelineResponse_CommitTxn{CommitTxn: &pb.CommitTxnResponse{Version: 5, Txn: "t"}}
		}
	}
	if rng.IntN(10) == 0 {
		r.Result = nil
	}
	return r
}

// randPipelineResponse is a random answer, or a carrier of a batch of them.
func randPipelineResponse(rng *rand.Rand) *pb.PipelineResponse {
	if rng.IntN(3) == 0 {
		return randPipelineResult(rng)
	}
	m := &pb.PipelineResponse{}
	for range 1 + rng.IntN(20) {
		m.Batch = append(m.Batch, randPipelineResult(rng))
	}
	return m
}

// TestDecodePipelineResponseMatchesProto: every answer a server sends is
// decoded by decodePipelineResponse, into what proto.Unmarshal makes of it.
func TestDecodePipelineResponseMatchesProto(t *testing.T) {
	checkDecodeMatches(t, randPipelineResponse, decodePipelineResponse)
}

// TestDecodePipelineResponseMalformed is TestDecodePipelineRequestMalformed
// for answers.
func TestDecodePipelineResponseMalformed(t *testing.T) {
	checkDecodeMalformed(t, randPipelineResponse, decodePipelineResponse)
}

// TestDecodePipelineResponseCopies is TestDecodePipelineRequestCopies for
// answers.
func TestDecodePipelineResponseCopies(t *testing.T) {
	want := &pb.PipelineResponse{Batch: []*pb.PipelineResponse{
		{Id: 1, Result: &pb.PipelineResponse_Get{Get: &pb.GetResponse{Key: []byte("key"), Value: []byte("value"), Tags: []string{"t"}, Version: 7}}},
		{Id: 2, Result: &pb.PipelineResponse_Put{Put: &pb.PutResponse{Version: 8}}},
		{Id: 3, Result: &pb.PipelineResponse_Error{Error: &pb.PipelineError{Code: "not_found", Message: "no"}}},
		{Id: 4, Result: &pb.PipelineResponse_ScanBytes{ScanBytes: []byte("scan")}},
	}}
	b, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got pb.PipelineResponse
	if !decodePipelineResponse(b, &got) {
		t.Fatal("not decoded")
	}
	clear(b)
	if !proto.Equal(&got, want) {
		t.Fatalf("after the buffer was cleared: %v, want %v", &got, want)
	}
	g := got.Batch[0].GetGet()
	g.Key = append(g.Key, "more"...)
	if !bytes.Equal(g.Value, []byte("value")) {
		t.Fatalf("appending to the key changed the value: %q", g.Value)
	}
}

// BenchmarkDecodePipelineRequest decodes a batch of 8 requests (4 puts of
// 100-byte values, 4 gets), by hand and by proto.Unmarshal.
func BenchmarkDecodePipelineRequest(b *testing.B) {
	m := &pb.PipelineRequest{}
	for i := range 8 {
		key := []byte("user" + strconv.Itoa(1000+i))
		if i%2 == 0 {
			m.Batch = append(m.Batch, &pb.PipelineRequest{Id: uint64(i), Op: &pb.PipelineRequest_Put{Put: &pb.PutRequest{Collection: "usertable", Key: key, Value: bytes.Repeat([]byte("v"), 100)}}})
		} else {
			m.Batch = append(m.Batch, &pb.PipelineRequest{Id: uint64(i), Op: &pb.PipelineRequest_Get{Get: &pb.GetRequest{Collection: "usertable", Key: key}}})
		}
	}
	enc, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r pb.PipelineRequest
			if !decodePipelineRequest(enc, &r) {
				b.Fatal("not decoded")
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r pb.PipelineRequest
			if err := proto.Unmarshal(enc, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDecodePipelineResponse decodes a batch of 8 answers (4 puts', 4
// gets' of 100-byte values), by hand and by proto.Unmarshal.
func BenchmarkDecodePipelineResponse(b *testing.B) {
	m := &pb.PipelineResponse{}
	for i := range 8 {
		if i%2 == 0 {
			m.Batch = append(m.Batch, &pb.PipelineResponse{Id: uint64(i), Result: &pb.PipelineResponse_Put{Put: &pb.PutResponse{Version: 1 << 30}}})
		} else {
			m.Batch = append(m.Batch, &pb.PipelineResponse{Id: uint64(i), Result: &pb.PipelineResponse_Get{Get: &pb.GetResponse{Key: []byte("user" + strconv.Itoa(1000+i)), Value: bytes.Repeat([]byte("v"), 100), Version: 1 << 30}}})
		}
	}
	enc, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r pb.PipelineResponse
			if !decodePipelineResponse(enc, &r) {
				b.Fatal("not decoded")
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r pb.PipelineResponse
			if err := proto.Unmarshal(enc, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzDecodePipelineRequest: whatever bytes a stream carries,
// decodePipelineRequest either leaves them to proto.Unmarshal or decodes
// them as it does (and never panics). The seeds are messages clients send.
func FuzzDecodePipelineRequest(f *testing.F) {
	fuzzDecode(f, randPipelineRequest, decodePipelineRequest)
}

// FuzzDecodePipelineResponse is FuzzDecodePipelineRequest for the answers.
func FuzzDecodePipelineResponse(f *testing.F) {
	fuzzDecode(f, randPipelineResponse, decodePipelineResponse)
}

func fuzzDecode[T any, M interface {
	*T
	proto.Message
}](f *testing.F, gen func(*rand.Rand) M, decode func([]byte, M) bool) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 16 {
		b, err := proto.Marshal(gen(rng))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := M(new(T))
		if !decode(b, got) {
			return
		}
		want := M(new(T))
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatalf("decoded %x, which proto.Unmarshal refuses: %v", b, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("decoded %x as\n%v\nproto.Unmarshal as\n%v", b, got, want)
		}
	})
}
