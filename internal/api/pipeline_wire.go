package api

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// Field numbers of PipelineRequest and of the requests it carries
// (proto/groupkv.proto).
const (
	fieldPipelineRequestID        = 1
	fieldPipelineRequestTimeout   = 2
	fieldPipelineRequestPut       = 3
	fieldPipelineRequestGet       = 4
	fieldPipelineRequestDelete    = 5
	fieldPipelineRequestBatch     = 6
	fieldPipelineRequestScan      = 7
	fieldPipelineRequestTxnGet    = 8
	fieldPipelineRequestCommitTxn = 9

	fieldPutCollection = 1 // PutRequest, GetRequest, DeleteRequest
	fieldPutKey        = 2 // PutRequest, GetRequest, DeleteRequest
	fieldPutValue      = 3
	fieldPutTags       = 4
	fieldPutIfVersion  = 5
	fieldGetVersion    = 3
	fieldDelIfVersion  = 3
)

// decodePipelineRequest decodes b into m, an empty message, as
// proto.Unmarshal would, and reports whether it did. It takes the messages
// a Pipeline stream carries under load (puts, gets and deletes, alone or in
// a batch) with a few allocations per message instead of six per request:
// the requests of a batch, their oneof wrappers and their messages come
// from one slice per kind, a request's key and value share one allocation,
// and a collection named again by the next request is not copied again.
// Anything else it leaves to proto.Unmarshal by reporting false (m may then
// hold part of b): a field it does not know or of another wire type, a
// oneof set twice, a batch within a batch, a string that is not UTF-8, a
// malformed encoding. Scans and a transaction's requests are decoded by
// proto.Unmarshal, each in its own message, as it would.
func decodePipelineRequest(b []byte, m *pb.PipelineRequest) bool {
	n, items, ok := countKinds(b, fieldPipelineRequestBatch, fieldPipelineRequestPut, isWireOp)
	if !ok {
		return false
	}
	d := requestDecoder{}
	if n[0] > 0 {
		d.puts = make([]putSlot, n[0])
	}
	if n[1] > 0 {
		d.gets = make([]getSlot, n[1])
	}
	if n[2] > 0 {
		d.dels = make([]delSlot, n[2])
	}
	if items > 0 {
		d.items = make([]pb.PipelineRequest, items)
		m.Batch = make([]*pb.PipelineRequest, 0, items)
	}
	return d.request(b, m, true)
}

// take removes the first of slots and returns it, or nil when none is left.
func take[S any](slots *[]S) *S {
	if len(*slots) == 0 {
		return nil
	}
	s := &(*slots)[0]
	*slots = (*slots)[1:]
	return s
}

// isWireOp reports whether num is a field of PipelineRequest's oneof op.
func isWireOp(num protowire.Number) bool {
	return num >= fieldPipelineRequestPut && num <= fieldPipelineRequestCommitTxn && num != fieldPipelineRequestBatch
}

// countKinds counts the requests (or answers) of each kind in the encoded
// message b, in it and in its batch (field batch): put, get and delete,
// whose fields in the oneof that isOneof tells are put, put+1 and put+2;
// and the batch's. It reports false for a message decodePipelineRequest
// and decodePipelineResponse leave to proto: malformed, or with an item
// whose oneof is set twice.
func countKinds(b []byte, batch, put protowire.Number, isOneof func(protowire.Number) bool) (n [3]int, items int, ok bool) {
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return n, 0, false
		}
		b = b[k:]
		if typ == protowire.BytesType && (num == batch || isOneof(num)) {
			v, k := protowire.ConsumeBytes(b)
			if k < 0 {
				return n, 0, false
			}
			b = b[k:]
			kind := num
			if num == batch {
				items++
				if kind = itemKind(v, isOneof); kind < 0 {
					return n, 0, false
				}
			}
			if i := kind - put; i >= 0 && i < 3 {
				n[i]++
			}
			continue
		}
		if k = protowire.ConsumeFieldValue(num, typ, b); k < 0 {
			return n, 0, false
		}
		b = b[k:]
	}
	return n, items, true
}

// itemKind is the field number of the oneof that isOneof tells in the
// encoded message b, 0 for none, or -1 for a message left to proto (the
// oneof set twice, a malformed encoding).
func itemKind(b []byte, isOneof func(protowire.Number) bool) protowire.Number {
	var kind protowire.Number
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return -1
		}
		b = b[k:]
		if k = protowire.ConsumeFieldValue(num, typ, b); k < 0 {
			return -1
		}
		b = b[k:]
		if isOneof(num) {
			if kind != 0 {
				return -1
			}
			kind = num
		}
	}
	return kind
}

type putSlot struct {
	w pb.PipelineRequest_Put
	r pb.PutRequest
}

type getSlot struct {
	w pb.PipelineRequest_Get
	r pb.GetRequest
}

type delSlot struct {
	w pb.PipelineRequest_Delete
	r pb.DeleteRequest
}

// requestDecoder holds what decodePipelineRequest hands out: a slot for
// each request of a kind, in order, and the collection named last.
type requestDecoder struct {
	puts       []putSlot
	gets       []getSlot
	dels       []delSlot
	items      []pb.PipelineRequest
	collection string
}

// request decodes b into m; a batch's requests only when top.
func (d *requestDecoder) request(b []byte, m *pb.PipelineRequest, top bool) bool {
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return false
		}
		b = b[k:]
		switch {
		case typ == protowire.VarintType && (num == fieldPipelineRequestID || num == fieldPipelineRequestTimeout):
			v, k := protowire.ConsumeVarint(b)
			if k < 0 {
				return false
			}
			b = b[k:]
			if num == fieldPipelineRequestID {
				m.Id = v
			} else {
				m.TimeoutMicros = v
			}
		case typ == protowire.BytesType && isWireOp(num):
			v, k := protowire.ConsumeBytes(b)
			if k < 0 || m.Op != nil {
				return false // a second op merges into the first: proto's
			}
			b = b[k:]
			if !d.op(num, v, m) {
				return false
			}
		case typ == protowire.BytesType && num == fieldPipelineRequestBatch && top:
			v, k := protowire.ConsumeBytes(b)
			item := take(&d.items)
			if k < 0 || item == nil {
				return false
			}
			b = b[k:]
			if !d.request(v, item, false) {
				return false
			}
			m.Batch = append(m.Batch, item)
		default:
			return false
		}
	}
	return true
}

// op decodes v, the op of field num, into m.
func (d *requestDecoder) op(num protowire.Number, v []byte, m *pb.PipelineRequest) bool {
	switch num {
	case fieldPipelineRequestPut:
		s := take(&d.puts)
		if s == nil || !d.put(v, &s.r) {
			return false
		}
		s.w.Put = &s.r
		m.Op = &s.w
	case fieldPipelineRequestGet:
		s := take(&d.gets)
		if s == nil || !d.get(v, &s.r) {
			return false
		}
		s.w.Get = &s.r
		m.Op = &s.w
	case fieldPipelineRequestDelete:
		s := take(&d.dels)
		if s == nil || !d.del(v, &s.r) {
			return false
		}
		s.w.Delete = &s.r
		m.Op = &s.w
	case fieldPipelineRequestScan:
		r := new(pb.ScanRequest)
		if proto.Unmarshal(v, r) != nil {
			return false
		}
		m.Op = &pb.PipelineRequest_Scan{Scan: r}
	case fieldPipelineRequestTxnGet:
		r := new(pb.TxnGetRequest)
		if proto.Unmarshal(v, r) != nil {
			return false
		}
		m.Op = &pb.PipelineRequest_TxnGet{TxnGet: r}
	case fieldPipelineRequestCommitTxn:
		r := new(pb.CommitTxnRequest)
		if proto.Unmarshal(v, r) != nil {
			return false
		}
		m.Op = &pb.PipelineRequest_CommitTxn{CommitTxn: r}
	default:
		return false
	}
	return true
}

// put decodes a PutRequest.
func (d *requestDecoder) put(b []byte, r *pb.PutRequest) bool {
	buf := make([]byte, 0, bytesFieldsSize(b, fieldPutKey, fieldPutValue))
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return false
		}
		b = b[k:]
		switch {
		case typ == protowire.BytesType && num == fieldPutCollection:
			if k = d.collectionField(b, &r.Collection); k < 0 {
				return false
			}
		case typ == protowire.BytesType && num == fieldPutKey:
			if k = bytesField(b, &buf, &r.Key); k < 0 {
				return false
			}
		case typ == protowire.BytesType && num == fieldPutValue:
			if k = bytesField(b, &buf, &r.Value); k < 0 {
				return false
			}
		case typ == protowire.BytesType && num == fieldPutTags:
			var t string
			if k = stringField(b, &t); k < 0 {
				return false
			}
			r.Tags = append(r.Tags, t)
		case typ == protowire.VarintType && num == fieldPutIfVersion:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			r.IfVersion = &v
			k = n
		default:
			return false
		}
		b = b[k:]
	}
	return true
}

// get decodes a GetRequest.
func (d *requestDecoder) get(b []byte, r *pb.GetRequest) bool {
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return false
		}
		b = b[k:]
		switch {
		case typ == protowire.BytesType && num == fieldPutCollection:
			k = d.collectionField(b, &r.Collection)
		case typ == protowire.BytesType && num == fieldPutKey:
			var buf []byte
			k = bytesField(b, &buf, &r.Key)
		case typ == protowire.VarintType && num == fieldGetVersion:
			r.Version, k = protowire.ConsumeVarint(b)
		default:
			return false
		}
		if k < 0 {
			return false
		}
		b = b[k:]
	}
	return true
}

// del decodes a DeleteRequest.
func (d *requestDecoder) del(b []byte, r *pb.DeleteRequest) bool {
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return false
		}
		b = b[k:]
		switch {
		case typ == protowire.BytesType && num == fieldPutCollection:
			k = d.collectionField(b, &r.Collection)
		case typ == protowire.BytesType && num == fieldPutKey:
			var buf []byte
			k = bytesField(b, &buf, &r.Key)
		case typ == protowire.VarintType && num == fieldDelIfVersion:
			var v uint64
			if v, k = protowire.ConsumeVarint(b); k >= 0 {
				r.IfVersion = &v
			}
		default:
			return false
		}
		if k < 0 {
			return false
		}
		b = b[k:]
	}
	return true
}

// collectionField decodes the string at the start of b into dst, the
// collection named last when it is the same, and returns its length or -1.
func (d *requestDecoder) collectionField(b []byte, dst *string) int {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return -1
	}
	if string(v) != d.collection {
		if !utf8.Valid(v) {
			return -1
		}
		d.collection = string(v)
	}
	*dst = d.collection
	return n
}

// bytesField decodes the bytes at the start of b into dst, a copy appended
// to *buf (nil when empty, as proto has it), and returns its length or -1.
func bytesField(b []byte, buf *[]byte, dst *[]byte) int {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return -1
	}
	if len(v) == 0 {
		*dst = nil
		return n
	}
	start := len(*buf)
	*buf = append(*buf, v...)
	*dst = (*buf)[start:len(*buf):len(*buf)]
	return n
}

// bytesFieldsSize is the length of every bytes field numbered a or c in
// the encoded message b (or less, for a malformed one).
func bytesFieldsSize(b []byte, a, c protowire.Number) int {
	size := 0
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return size
		}
		b = b[k:]
		if typ == protowire.BytesType && (num == a || num == c) {
			v, _ := protowire.ConsumeBytes(b)
			size += len(v)
		}
		if k = protowire.ConsumeFieldValue(num, typ, b); k < 0 {
			return size
		}
		b = b[k:]
	}
	return size
}

// Field numbers of PipelineResponse and of the answers it carries
// (proto/groupkv.proto).
const (
	fieldPipelineResponseID        = 1
	fieldPipelineResponsePut       = 2
	fieldPipelineResponseGet       = 3
	fieldPipelineResponseDelete    = 4
	fieldPipelineResponseError     = 5
	fieldPipelineResponseBatch     = 6
	fieldPipelineResponseTxnGet    = 8
	fieldPipelineResponseCommitTxn = 9
	fieldPipelineResponseScanBytes = 10

	fieldWriteVersion = 1 // PutResponse, DeleteResponse

	fieldGetKey           = 1 // GetResponse
	fieldGetValue         = 2
	fieldGetTags          = 3
	fieldGetAnswerVersion = 4

	fieldErrorCode     = 1 // PipelineError
	fieldErrorMessage  = 2
	fieldErrorGRPCCode = 3
	fieldErrorTxn      = 4
)

// isWireResult reports whether num is a field of PipelineResponse's oneof
// result.
func isWireResult(num protowire.Number) bool {
	return num >= fieldPipelineResponsePut && num <= fieldPipelineResponseScanBytes && num != fieldPipelineResponseBatch
}

type putAnswerSlot struct {
	w pb.PipelineResponse_Put
	r pb.PutResponse
}

type getAnswerSlot struct {
	w pb.PipelineResponse_Get
	r pb.GetResponse
}

type delAnswerSlot struct {
	w pb.PipelineResponse_Delete
	r pb.DeleteResponse
}

// responseDecoder is requestDecoder's counterpart for PipelineResponse.
type responseDecoder struct {
	puts  []putAnswerSlot
	gets  []getAnswerSlot
	dels  []delAnswerSlot
	items []pb.PipelineResponse
}

// decodePipelineResponse is decodePipelineRequest for the answers a
// client reads from a Pipeline stream: puts', gets', deletes' and errors,
// alone or in a batch, from one slice per kind; a get's key and value in
// one allocation. Scans and a transaction's answers are decoded by
// proto.Unmarshal, each in its own message; anything it does not take it
// leaves to proto.Unmarshal by reporting false.
func decodePipelineResponse(b []byte, m *pb.PipelineResponse) bool {
	n, items, ok := countKinds(b, fieldPipelineResponseBatch, fieldPipelineResponsePut, isWireResult)
	if !ok {
		return false
	}
	d := responseDecoder{}
	if n[0] > 0 {
		d.puts = make([]putAnswerSlot, n[0])
	}
	if n[1] > 0 {
		d.gets = make([]getAnswerSlot, n[1])
	}
	if n[2] > 0 {
		d.dels = make([]delAnswerSlot, n[2])
	}
	if items > 0 {
		d.items = make([]pb.PipelineResponse, items)
		m.Batch = make([]*pb.PipelineResponse, 0, items)
	}
	return d.response(b, m, true)
}

// response decodes b into m; a batch's answers only when top.
func (d *responseDecoder) response(b []byte, m *pb.PipelineResponse, top bool) bool {
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return false
		}
		b = b[k:]
		switch {
		case typ == protowire.VarintType && num == fieldPipelineResponseID:
			if m.Id, k = protowire.ConsumeVarint(b); k < 0 {
				return false
			}
			b = b[k:]
		case typ == protowire.BytesType && isWireResult(num):
			v, k := protowire.ConsumeBytes(b)
			if k < 0 || m.Result != nil {
				return false
			}
			b = b[k:]
			if !d.result(num, v, m) {
				return false
			}
		case typ == protowire.BytesType && num == fieldPipelineResponseBatch && top:
			v, k := protowire.ConsumeBytes(b)
			item := take(&d.items)
			if k < 0 || item == nil {
				return false
			}
			b = b[k:]
			if !d.response(v, item, false) {
				return false
			}
			m.Batch = append(m.Batch, item)
		default:
			return false
		}
	}
	return true
}

// result decodes v, the result of field num, into m.
func (d *responseDecoder) result(num protowire.Number, v []byte, m *pb.PipelineResponse) bool {
	switch num {
	case fieldPipelineResponsePut:
		s := take(&d.puts)
		if s == nil || !decodeVersionOnly(v, &s.r.Version) {
			return false
		}
		s.w.Put = &s.r
		m.Result = &s.w
	case fieldPipelineResponseDelete:
		s := take(&d.dels)
		if s == nil || !decodeVersionOnly(v, &s.r.Version) {
			return false
		}
		s.w.Delete = &s.r
		m.Result = &s.w
	case fieldPipelineResponseGet:
		s := take(&d.gets)
		if s == nil || !decodeGetAnswer(v, &s.r) {
			return false
		}
		s.w.Get = &s.r
		m.Result = &s.w
	case fieldPipelineResponseError:
		e := new(pb.PipelineError)
		if !decodePipelineError(v, e) {
			return false
		}
		m.Result = &pb.PipelineResponse_Error{Error: e}
	case fieldPipelineResponseScanBytes:
		m.Result = &pb.PipelineResponse_ScanBytes{ScanBytes: append([]byte{}, v...)}
	case fieldPipelineResponseScan:
		r := new(pb.ScanResponse)
		if proto.Unmarshal(v, r) != nil {
			return false
		}
		m.Result = &pb.PipelineResponse_Scan{Scan: r}
	case fieldPipelineResponseTxnGet:
		r := new(pb.TxnGetResponse)
		if proto.Unmarshal(v, r) != nil {
			return false
		}
		m.Result = &pb.PipelineResponse_TxnGet{TxnGet: r}
	case fieldPipelineResponseCommitTxn:
		r := new(pb.CommitTxnResponse)
		if proto.Unmarshal(v, r) != nil {
			return false
		}
		m.Result = &pb.PipelineResponse_CommitTxn{CommitTxn: r}
	default:
		return false
	}
	return true
}

// decodeVersionOnly decodes a PutResponse or DeleteResponse.
func decodeVersionOnly(b []byte, version *uint64) bool {
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 || typ != protowire.VarintType || num != fieldWriteVersion {
			return false
		}
		b = b[k:]
		if *version, k = protowire.ConsumeVarint(b); k < 0 {
			return false
		}
		b = b[k:]
	}
	return true
}

// decodeGetAnswer decodes a GetResponse.
func decodeGetAnswer(b []byte, r *pb.GetResponse) bool {
	buf := make([]byte, 0, bytesFieldsSize(b, fieldGetKey, fieldGetValue))
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return false
		}
		b = b[k:]
		switch {
		case typ == protowire.BytesType && num == fieldGetKey:
			k = bytesField(b, &buf, &r.Key)
		case typ == protowire.BytesType && num == fieldGetValue:
			k = bytesField(b, &buf, &r.Value)
		case typ == protowire.BytesType && num == fieldGetTags:
			var t string
			if k = stringField(b, &t); k >= 0 {
				r.Tags = append(r.Tags, t)
			}
		case typ == protowire.VarintType && num == fieldGetAnswerVersion:
			r.Version, k = protowire.ConsumeVarint(b)
		default:
			return false
		}
		if k < 0 {
			return false
		}
		b = b[k:]
	}
	return true
}

// decodePipelineError decodes a PipelineError.
func decodePipelineError(b []byte, e *pb.PipelineError) bool {
	for len(b) > 0 {
		num, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return false
		}
		b = b[k:]
		switch {
		case typ == protowire.BytesType && num == fieldErrorCode:
			k = stringField(b, &e.Code)
		case typ == protowire.BytesType && num == fieldErrorMessage:
			k = stringField(b, &e.Message)
		case typ == protowire.BytesType && num == fieldErrorTxn:
			k = stringField(b, &e.Txn)
		case typ == protowire.VarintType && num == fieldErrorGRPCCode:
			var v uint64
			v, k = protowire.ConsumeVarint(b)
			e.GrpcCode = uint32(v)
		default:
			return false
		}
		if k < 0 {
			return false
		}
		b = b[k:]
	}
	return true
}

// stringField decodes the string at the start of b into dst and returns
// its length, or -1 for one that is not UTF-8 (proto refuses it).
func stringField(b []byte, dst *string) int {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 || !utf8.Valid(v) {
		return -1
	}
	*dst = string(v)
	return n
}
