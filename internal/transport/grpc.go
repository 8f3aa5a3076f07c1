package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/groupkv/groupkv/internal/replication"
	"github.com/groupkv/groupkv/proto/transportpb"
)

// Resolver says where replica replicaID of shard shardID lives: the id and
// the peer (transport) address of its node. ok false means unknown; the
// message is dropped. It is called from Send and must not block.
type Resolver func(shardID, replicaID uint64) (nodeID uint64, addr string, ok bool)

// Options configure a GRPC transport. The zero value of every field but
// Resolver means its default.
type Options struct {
	// Resolver locates replicas (required).
	Resolver Resolver
	// QueueLen bounds the messages waiting for one destination node; what
	// does not fit is dropped. 0 means 4096: a cycle's heartbeats and
	// appends for a few thousand shards, far more than one stream write
	// falls behind by while the peer keeps up.
	QueueLen int
	// MaxBatchBytes caps the encoded size of one RaftBatch write; a bigger
	// backlog is split over several writes (a single larger message is sent
	// alone). 0 means 1 MiB, well under gRPC's default 4 MiB receive limit.
	MaxBatchBytes int
	// MinBackoff and MaxBackoff bound the wait before redialling a node
	// after a failed stream; it doubles on each failure in a row. 0 means
	// 20ms (a restarting peer is back quickly) and 1s (about an election
	// timeout, so a returning peer is not kept waiting much longer).
	MinBackoff, MaxBackoff time.Duration
	// DialOptions answers the options of a connection to a peer at addr
	// (host:port); with none the connections are insecure (plaintext).
	DialOptions func(addr string) []grpc.DialOption
	// SnapshotSent, if set, is told how sending each snapshot that went on
	// a stream of its own ended (see snapshot.go). It must not block.
	SnapshotSent func(shardID, to uint64, ok bool)
	Logger       *slog.Logger
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.QueueLen <= 0 {
		o.QueueLen = 4096
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = 1 << 20
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 20 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = o.MinBackoff
	}
	if o.DialOptions == nil {
		o.DialOptions = func(string) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// GRPC is a replication.Transport over gRPC client streams, one per
// destination node. It is safe for concurrent use.
type GRPC struct {
	opts    Options
	dropped atomic.Uint64
	// streamed counts snapshots sent whole on streams of their own.
	streamed atomic.Uint64
	// ctx ends at Close; snapshot streams run under it, counted by snaps.
	ctx    context.Context
	cancel context.CancelFunc
	snaps  sync.WaitGroup

	mu struct {
		sync.Mutex
		// senders holds the sender of each destination node. Nothing may
		// block while mu is held: Send takes it on the Host loop.
		senders map[uint64]*sender
		// retired holds stopped senders of nodes that moved, for Close to
		// wait for.
		retired []*sender
		closed  bool
	}
}

var _ replication.Transport = (*GRPC)(nil)

// NewGRPC returns a transport that dials peers lazily, on the first message
// for each. It panics without a Resolver.
func NewGRPC(opts Options) *GRPC {
	if opts.Resolver == nil {
		panic("transport: Options.Resolver is required")
	}
	opts.EnsureDefaults()
	t := &GRPC{opts: opts}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.mu.senders = make(map[uint64]*sender)
	return t
}

// Send queues msgs for their nodes and returns at once. Messages whose
// replica cannot be resolved, that do not fit their node's queue, or that
// are sent after Close are dropped and counted in Dropped. Send takes
// ownership of msgs.
func (t *GRPC) Send(msgs []replication.Message) {
	if len(msgs) == 0 {
		return
	}
	type dest struct {
		addr string
		msgs []replication.Message
	}
	var byNode map[uint64]*dest
	var dropped uint64
	for _, m := range msgs {
		node, addr, ok := t.opts.Resolver(m.ShardID, m.Msg.To)
		if !ok {
			dropped++
			continue
		}
		if m.Msg.Type == raftpb.MsgSnap && m.Msg.Snapshot != nil && len(m.Msg.Snapshot.Data) > t.opts.MaxBatchBytes {
			t.mu.Lock()
			closed := t.mu.closed
			if !closed {
				t.snaps.Add(1)
			}
			t.mu.Unlock()
			if closed {
				dropped++
				continue
			}
			go func(addr string, m replication.Message) {
				defer t.snaps.Done()
				t.streamSnapshot(addr, m)
			}(addr, m)
			continue
		}
		if byNode == nil {
			byNode = make(map[uint64]*dest)
		}
		d := byNode[node]
		if d == nil {
			d = &dest{addr: addr}
			byNode[node] = d
		}
		d.msgs = append(d.msgs, m)
	}
	t.mu.Lock()
	for node, d := range byNode {
		if t.mu.closed {
			dropped += uint64(len(d.msgs))
			continue
		}
		s := t.mu.senders[node]
		if s != nil && s.addr != d.addr {
			// The node moved: retire the old stream (stop does not wait).
			s.stop()
			t.mu.retired = append(t.mu.retired, s)
			s = nil
		}
		if s == nil {
			s = newSender(t, node, d.addr)
			t.mu.senders[node] = s
		}
		dropped += uint64(s.enqueue(d.msgs))
	}
	t.mu.Unlock()
	if dropped > 0 {
		t.dropped.Add(dropped)
	}
}

// Dropped returns how many messages were dropped so far: unresolvable, over
// a full queue, queued while their node was unreachable, or sent after
// Close.
func (t *GRPC) Dropped() uint64 { return t.dropped.Load() }

// SnapshotsStreamed returns how many snapshots were sent in chunks on
// streams of their own.
func (t *GRPC) SnapshotsStreamed() uint64 { return t.streamed.Load() }

// Close stops every sender, waits for them and closes their connections.
// Later Sends drop their messages.
func (t *GRPC) Close() error {
	t.mu.Lock()
	if t.mu.closed {
		t.mu.Unlock()
		return nil
	}
	t.mu.closed = true
	senders := t.mu.retired
	for _, s := range t.mu.senders {
		senders = append(senders, s)
	}
	t.mu.senders, t.mu.retired = nil, nil
	t.mu.Unlock()
	t.cancel()
	t.snaps.Wait()
	for _, s := range senders {
		s.stop()
	}
	for _, s := range senders {
		<-s.done
	}
	return nil
}

// sender owns the connection and stream to one node and runs one goroutine
// that drains the node's queue.
type sender struct {
	t    *GRPC
	node uint64
	addr string
	// wake has room for one signal: "the queue is not empty".
	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu struct {
		sync.Mutex
		// queue holds the messages not yet taken by the goroutine.
		// Invariant: len(queue) <= t.opts.QueueLen.
		queue []replication.Message
	}
}

func newSender(t *GRPC, node uint64, addr string) *sender {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sender{t: t, node: node, addr: addr, wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go s.run()
	return s
}

// enqueue appends what fits of msgs to the queue and returns how many it
// dropped. A batch that does not fit whole is dropped whole.
func (s *sender) enqueue(msgs []replication.Message) int {
	s.mu.Lock()
	if len(s.mu.queue)+len(msgs) > s.t.opts.QueueLen {
		s.mu.Unlock()
		return len(msgs)
	}
	s.mu.queue = append(s.mu.queue, msgs...)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return 0
}

// take empties the queue and returns what it held.
func (s *sender) take() []replication.Message {
	s.mu.Lock()
	q := s.mu.queue
	s.mu.queue = nil
	s.mu.Unlock()
	return q
}

func (s *sender) stop() { s.cancel() }

func (s *sender) run() {
	defer close(s.done)
	log := s.t.opts.Logger.With("node", s.node, "addr", s.addr)
	conn, err := grpc.NewClient(s.addr, s.t.opts.DialOptions(s.addr)...)
	if err != nil {
		// A malformed address: nothing will ever reach this node.
		log.Error("raft transport: bad peer address", "err", err)
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-s.wake:
				s.t.dropped.Add(uint64(len(s.take())))
			}
		}
	}
	defer conn.Close()
	client := transportpb.NewRaftTransportClient(conn)
	var stream transportpb.RaftTransport_RaftClient
	var cancelStream context.CancelFunc
	closeStream := func() {
		if cancelStream != nil {
			cancelStream()
		}
		stream, cancelStream = nil, nil
	}
	defer closeStream()
	backoff := time.Duration(0)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		}
		if stream == nil {
			sctx, cancel := context.WithCancel(s.ctx)
			st, err := client.Raft(sctx)
			if err != nil {
				cancel()
				backoff = s.fail(log, "dial", err, backoff)
				continue
			}
			stream, cancelStream = st, cancel
		}
		if err := s.sendQueued(stream); err != nil {
			closeStream()
			backoff = s.fail(log, "send", err, backoff)
			continue
		}
		backoff = 0
	}
}

// sendQueued writes everything queued as RaftBatch messages of at most
// MaxBatchBytes each.
func (s *sender) sendQueued(stream transportpb.RaftTransport_RaftClient) error {
	msgs := s.take()
	batch := &transportpb.RaftBatch{}
	size := 0
	for i := range msgs {
		b, err := msgs[i].Msg.Marshal()
		if err != nil {
			// Cannot happen for a message raft produced; drop it.
			s.t.dropped.Add(1)
			continue
		}
		if size > 0 && size+len(b) > s.t.opts.MaxBatchBytes {
			if err := stream.Send(batch); err != nil {
				s.t.dropped.Add(uint64(len(msgs) - i + len(batch.Envelopes)))
				return err
			}
			batch, size = &transportpb.RaftBatch{}, 0
		}
		batch.Envelopes = append(batch.Envelopes, &transportpb.Envelope{ShardId: msgs[i].ShardID, Msg: b})
		size += len(b) + 16
	}
	if len(batch.Envelopes) == 0 {
		return nil
	}
	if err := stream.Send(batch); err != nil {
		s.t.dropped.Add(uint64(len(batch.Envelopes)))
		return err
	}
	return nil
}

// fail handles a failed dial or send: it waits out the backoff (or until
// stop), drops what was queued meanwhile and returns the next backoff. The
// queue is then empty; the next Send wakes the goroutine again.
func (s *sender) fail(log *slog.Logger, op string, err error, backoff time.Duration) time.Duration {
	if s.ctx.Err() != nil {
		return backoff
	}
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("stream closed by peer")
	}
	if backoff == 0 {
		backoff = s.t.opts.MinBackoff
		log.Debug("raft transport: stream failed", "op", op, "err", err)
	} else {
		backoff = min(2*backoff, s.t.opts.MaxBackoff)
	}
	timer := time.NewTimer(backoff)
	select {
	case <-s.ctx.Done():
	case <-timer.C:
	}
	timer.Stop()
	s.t.dropped.Add(uint64(len(s.take())))
	return backoff
}

// Register registers the raft transport service on s. Every message of every
// batch received is handed to deliver (normally the local Host's Deliver),
// in the order sent; deliver must not block. A batch that does not decode
// ends its stream with InvalidArgument, after delivering the messages before
// the bad one; the sender redials.
func Register(s grpc.ServiceRegistrar, deliver func(replication.Message)) {
	transportpb.RegisterRaftTransportServer(s, &server{deliver: deliver})
	registerSnapshots(s, deliver)
}

type server struct {
	transportpb.UnimplementedRaftTransportServer
	deliver func(replication.Message)
}

func (s *server) Raft(stream transportpb.RaftTransport_RaftServer) error {
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&transportpb.RaftAck{})
		}
		if err != nil {
			return err
		}
		for i, e := range b.Envelopes {
			var m raftpb.Message
			if err := m.Unmarshal(e.Msg); err != nil {
				return status.Errorf(codes.InvalidArgument, "transport: envelope %d (shard %d): bad raft message: %v", i, e.ShardId, err)
			}
			s.deliver(replication.Message{ShardID: e.ShardId, Msg: m})
		}
	}
}
