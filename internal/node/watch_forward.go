package node

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"

	"github.com/groupkv/groupkv/internal/kv"
)

// A watch of shards this node holds no replica of runs on a node that
// holds them all, over a server-streaming method of the peer service; the
// events come back as they are delivered there.

const watchMethod = "/" + peerService + "Watch/Watch"

var watchStreamDesc = grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}

// watchFrame is one message of a forwarded watch: an event, or the error
// that ended it.
type watchFrame struct {
	Event *kv.Event  `json:"event,omitempty"`
	Error *peerError `json:"error,omitempty"`
}

func (n *Node) registerWatch(s grpc.ServiceRegistrar) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: peerService + "Watch",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Watch",
			ServerStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				var req kv.WatchRequest
				if err := stream.RecvMsg(&req); err != nil {
					return err
				}
				ctx := context.WithValue(stream.Context(), forwardedKey{}, true)
				err := n.Watch(ctx, req, func(ev kv.Event) error {
					return stream.SendMsg(&watchFrame{Event: &ev})
				})
				if err != nil && stream.Context().Err() == nil {
					return stream.SendMsg(&watchFrame{Error: toPeerError(err)})
				}
				return nil
			},
		}},
	}, n)
}

// forwardWatch runs a watch whose shards are not all held here on a node
// that holds them all; it reports false when the watch is local.
func (n *Node) forwardWatch(ctx context.Context, shards []uint64, req kv.WatchRequest, fn func(kv.Event) error) (bool, error) {
	target, ok, err := n.readTarget(ctx, shards)
	if !ok || err != nil {
		return ok, err
	}
	nd, found := n.nodeDesc(target)
	if !found {
		return true, kv.Errorf(kv.CodeUnavailable, "node %d is not a known member", target)
	}
	c, err := n.peers.conn(nd.PeerAddr)
	if err != nil {
		return true, kv.Errorf(kv.CodeUnavailable, "connecting to node %d: %v", target, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.NewStream(ctx, &watchStreamDesc, watchMethod)
	if err != nil {
		return true, kv.Errorf(kv.CodeUnavailable, "watching through node %d: %v", target, err)
	}
	if err := stream.SendMsg(&req); err != nil {
		return true, kv.Errorf(kv.CodeUnavailable, "watching through node %d: %v", target, err)
	}
	if err := stream.CloseSend(); err != nil {
		return true, kv.Errorf(kv.CodeUnavailable, "watching through node %d: %v", target, err)
	}
	for {
		var f watchFrame
		err := stream.RecvMsg(&f)
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return true, ctx.Err()
			}
			return true, kv.Errorf(kv.CodeUnavailable, "the watch through node %d broke: %v; resume from the last version seen", target, err)
		}
		if f.Error != nil {
			return true, f.Error.err()
		}
		if f.Event != nil {
			if err := fn(*f.Event); err != nil {
				return true, err
			}
		}
	}
}
