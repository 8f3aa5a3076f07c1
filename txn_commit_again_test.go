package groupkv_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/api"
	"github.com/groupkv/groupkv/internal/kv"
	pb "github.com/groupkv/groupkv/proto/groupkvpb"
)

// unknownTxn is a well-formed attempt id no node began.
const unknownTxn = "00000000000000010000000100000000000000aa"

// TestCommitSentAgain: against a real node, over HTTP and gRPC, a commit
// sent again (its client lost the answer) answers what the first one did
// and applies nothing again; a commit of an attempt the node does not
// know answers commit_unknown (503), never txn_aborted (409), whether or
// not it carries writes.
func TestCommitSentAgain(t *testing.T) {
	s := startTxnServer(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := groupkv.Dial(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.CreateCollection(ctx, groupkv.CollectionOptions{Name: "c", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	if err := whileUnavailable(func() error {
		_, err := db.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("warm"), Value: []byte("up")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	read := func(k string) string {
		t.Helper()
		r, err := db.Get(ctx, groupkv.GetRequest{Collection: "c", Key: []byte(k)})
		if err != nil {
			t.Fatal(err)
		}
		return string(r.Value)
	}

	t.Run("HTTP", func(t *testing.T) {
		post := func(path, body string) (int, string, string) {
			t.Helper()
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+path, strings.NewReader(body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var e struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			json.Unmarshal(b, &e)
			return resp.StatusCode, strings.TrimSpace(string(b)), e.Error.Code
		}
		begin := func() string {
			t.Helper()
			code, body, _ := post("/v1/txn", "")
			var b struct {
				Txn string `json:"txn"`
			}
			if code != 200 || json.Unmarshal([]byte(body), &b) != nil || b.Txn == "" {
				t.Fatalf("begin: %d %s", code, body)
			}
			return "/v1/txn/" + b.Txn
		}
		txn := begin()
		if code, body, _ := post(txn+"/put", `{"collection": "c", "key": "h", "value": "1"}`); code != 200 {
			t.Fatalf("put: %d %s", code, body)
		}
		code, first, _ := post(txn+"/commit", "")
		if code != 200 || !strings.Contains(first, `"committed":true`) {
			t.Fatalf("commit: %d %s", code, first)
		}
		if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("h"), Value: []byte("after")}); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if code, body, _ := post(txn+"/commit", ""); code != 200 || body != first {
				t.Fatalf("commit %d sent again: %d %s, want 200 %s", i+1, code, body, first)
			}
		}
		// Aborting a committed attempt changes nothing.
		if code, body, _ := post(txn+"/abort", ""); code != 200 {
			t.Fatalf("abort after the commit: %d %s", code, body)
		}
		if code, body, _ := post(txn+"/commit", ""); code != 200 || body != first {
			t.Fatalf("commit sent again after an abort: %d %s, want 200 %s", code, body, first)
		}
		if v := read("h"); v != "after" {
			t.Fatalf("h = %q after the commits sent again, want %q", v, "after")
		}

		aborted := begin()
		if code, body, _ := post(aborted+"/put", `{"collection": "c", "key": "h", "value": "lost"}`); code != 200 {
			t.Fatalf("put: %d %s", code, body)
		}
		if code, body, _ := post(aborted+"/abort", ""); code != 200 {
			t.Fatalf("abort: %d %s", code, body)
		}
		for i := range 2 {
			if code, body, ec := post(aborted+"/commit", ""); code != 409 || ec != "txn_aborted" {
				t.Fatalf("commit %d of an aborted attempt: %d %s, want 409 txn_aborted", i, code, body)
			}
		}

		if code, body, ec := post("/v1/txn/"+unknownTxn+"/commit", ""); code != 503 || ec != "commit_unknown" {
			t.Fatalf("commit of an unknown attempt: %d %s, want 503 commit_unknown", code, body)
		}
		if code, body, ec := post("/v1/txn/"+unknownTxn+"/put", `{"collection": "c", "key": "h", "value": "x"}`); code != 409 || ec != "txn_aborted" {
			t.Fatalf("put in an unknown attempt: %d %s, want 409 txn_aborted", code, body)
		}
		if code, body, _ := post("/v1/txn/"+unknownTxn+"/abort", ""); code != 200 {
			t.Fatalf("abort of an unknown attempt: %d %s", code, body)
		}
	})

	t.Run("gRPC", func(t *testing.T) {
		conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		raw := pb.NewGroupKVClient(conn)
		tc := api.NewTxnClient(raw, nil)
		id, err := tc.BeginTxn(ctx, kv.TxnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := tc.TxnPut(ctx, id, kv.PutItem{Collection: "c", Key: []byte("g"), Value: []byte("1")}); err != nil {
			t.Fatal(err)
		}
		v, err := tc.CommitTxn(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Put(ctx, groupkv.PutRequest{Collection: "c", Key: []byte("g"), Value: []byte("after")}); err != nil {
			t.Fatal(err)
		}
		if again, err := tc.CommitTxn(ctx, id); err != nil || again != v {
			t.Fatalf("commit sent again: %d, %v; want %d", again, err, v)
		}
		// With writes, a commit sent again cannot be told from a new one
		// carrying other writes: it is refused, and writes nothing.
		put := []*pb.TxnOp{{Op: "put", Collection: "c", Key: []byte("g"), Value: []byte("2")}}
		if _, err := raw.CommitTxn(ctx, &pb.CommitTxnRequest{Txn: id, Writes: put}); kv.CodeOf(api.ErrorFromStatus(err, true)) != kv.CodeInvalidArgument {
			t.Fatalf("commit sent again with writes: %v, want invalid_argument", err)
		}
		if again, err := tc.CommitTxn(ctx, id); err != nil || again != v {
			t.Fatalf("commit sent again after one with writes: %d, %v; want %d", again, err, v)
		}
		if v := read("g"); v != "after" {
			t.Fatalf("g = %q after the commits sent again, want %q", v, "after")
		}

		_, err = tc.CommitTxn(ctx, unknownTxn)
		if !errors.Is(err, groupkv.ErrCommitUnknown) {
			t.Fatalf("commit of an unknown attempt: %v, want commit_unknown", err)
		}
		_, err = raw.CommitTxn(ctx, &pb.CommitTxnRequest{Txn: unknownTxn, Writes: put})
		if !errors.Is(api.ErrorFromStatus(err, true), groupkv.ErrCommitUnknown) {
			t.Fatalf("commit with writes of an unknown attempt: %v, want commit_unknown", err)
		}
		if v := read("g"); v != "after" {
			t.Fatalf("g = %q, want %q", v, "after")
		}
	})
}
