package kv

import (
	"strings"
	"testing"
)

func TestValidateExec(t *testing.T) {
	get := TxnOp{Op: TxnOpGet, Collection: "c", Key: []byte("a")}
	put := TxnOp{Op: TxnOpPut, Collection: "c", Key: []byte("a"), Value: []byte("v"), Tags: []string{"t"}}
	for _, ok := range []ExecRequest{
		{Then: []TxnOp{get}},
		{Else: []TxnOp{put}},
		{If: []Compare{{Collection: "c", Key: []byte("a"), Version: 7}}, Then: []TxnOp{put, {Op: TxnOpDelete, Collection: "c", Key: []byte("b")}}, Else: []TxnOp{get}},
	} {
		if err := ValidateExec(ok); err != nil {
			t.Errorf("ValidateExec(%+v) = %v, want nil", ok, err)
		}
	}
	big := make([]byte, MaxRequestBytes)
	for _, bad := range []struct {
		req   ExecRequest
		code  Code
		words string
	}{
		{ExecRequest{}, CodeInvalidArgument, "no operations"},
		{ExecRequest{If: []Compare{{Collection: "c", Key: []byte("a")}}}, CodeInvalidArgument, "no operations"},
		{ExecRequest{If: []Compare{{Collection: "c"}}, Then: []TxnOp{get}}, CodeInvalidArgument, "if[0]: key is empty"},
		{ExecRequest{If: []Compare{{Collection: "C", Key: []byte("a")}}, Then: []TxnOp{get}}, CodeInvalidArgument, "if[0]: collection name"},
		{ExecRequest{Then: []TxnOp{get, {Op: "upsert", Collection: "c", Key: []byte("a")}}}, CodeInvalidArgument, `then[1]: op "upsert" is not known`},
		{ExecRequest{Then: []TxnOp{{Collection: "c", Key: []byte("a")}}}, CodeInvalidArgument, "then[0]: no op"},
		{ExecRequest{Then: []TxnOp{get}, Else: []TxnOp{{Op: TxnOpGet, Collection: "c", Key: []byte("a"), Value: []byte("v")}}}, CodeInvalidArgument, "else[0]: a get takes no value"},
		{ExecRequest{Then: []TxnOp{{Op: TxnOpDelete, Collection: "c", Key: []byte("a"), Tags: []string{"t"}}}}, CodeInvalidArgument, "then[0]: a delete takes no value and no tags"},
		{ExecRequest{Then: []TxnOp{{Op: TxnOpPut, Collection: "c", Key: []byte("a"), Tags: []string{"a,b"}}}}, CodeInvalidArgument, "then[0]: tag"},
		{ExecRequest{Then: []TxnOp{{Op: TxnOpPut, Collection: "c", Key: make([]byte, MaxKeySize+1)}}}, CodeTooLarge, "then[0]: key is"},
		{ExecRequest{If: []Compare{{Collection: "c", Key: []byte("a"), HasValue: true, Value: big}}, Then: []TxnOp{put}}, CodeTooLarge, "split it"},
	} {
		err := ValidateExec(bad.req)
		if CodeOf(err) != bad.code || !strings.Contains(err.Error(), bad.words) {
			t.Errorf("ValidateExec(%.200v) = %v, want %s saying %q", bad.req, err, bad.code, bad.words)
		}
	}
}
