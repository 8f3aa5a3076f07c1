package groupkv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/groupkv/groupkv/internal/cluster"
	"github.com/groupkv/groupkv/internal/kv"
)

// Shard routing of a remote DB (see Dial). Any node answers any request by
// forwarding it to the shard's leader; the client saves that hop for
// single-key operations: it learns the shard map — the collections' shards
// from ListCollections, the nodes' addresses and the shards' leaders from
// the node's GET /v1/cluster on the same port — caches it, sends each Put,
// Get and Delete of a hash or range collection straight to the leader of
// the key's shard, and refreshes the map when it is older than
// routeMaxAge or a routed call fails with a refusal (unavailable, not
// leader), which is retried once through the dialed node.

// routeMaxAge is how long a shard map is used before it is refreshed.
const routeMaxAge = 5 * time.Second

type router struct {
	seed     *remoteDB
	seedAddr string
	opts     dialOptions
	// scheme is that of the seed's HTTP address: "https://" over TLS.
	scheme string
	http   *http.Client

	mu struct {
		sync.Mutex
		// conns are the connections to other nodes, by address.
		conns map[string]*remoteDB
		// nodes maps node ids to client addresses.
		nodes map[uint64]string
		// colls are the collections' shard maps, leaders filled in.
		colls      map[string]kv.CollectionInfo
		fetched    time.Time
		refreshing bool
		closed     bool
		// groups are the groups' leader keys, by id.
		groups map[string]groupLeader
	}
}

// routedDB is a remote DB that routes single-key operations to leaders.
type routedDB struct {
	*remoteDB
	r *router
}

func newRoutedDB(seed *remoteDB, addr string, o dialOptions) *routedDB {
	r := &router{seed: seed, seedAddr: addr, opts: o, http: &http.Client{Timeout: 2 * time.Second}, scheme: "http://"}
	if o.tls != nil {
		r.scheme = "https://"
		r.http.Transport = &http.Transport{TLSClientConfig: o.tls.Clone(), Proxy: http.ProxyFromEnvironment}
	}
	r.mu.conns = make(map[string]*remoteDB)
	return &routedDB{remoteDB: seed, r: r}
}

type clusterJSON struct {
	Nodes []struct {
		ID   uint64 `json:"id"`
		Addr string `json:"addr"`
	} `json:"nodes"`
	Shards []struct {
		Shard  uint64 `json:"shard"`
		Leader uint64 `json:"leader"`
	} `json:"shards"`
}

// refresh reloads the shard map; on failure the old one stays (routing
// falls back to the dialed node for what it does not know).
func (r *router) refresh() {
	defer func() {
		r.mu.Lock()
		r.mu.refreshing = false
		r.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	colls, err := r.seed.ListCollections(ctx)
	if err != nil {
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.scheme+r.seedAddr+"/v1/cluster", nil)
	if err != nil {
		return
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	var cj clusterJSON
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&cj) != nil {
		return
	}
	leaders := make(map[uint64]uint64, len(cj.Shards))
	for _, s := range cj.Shards {
		leaders[s.Shard] = s.Leader
	}
	nodes := make(map[uint64]string, len(cj.Nodes))
	for _, n := range cj.Nodes {
		nodes[n.ID] = n.Addr
	}
	m := make(map[string]kv.CollectionInfo, len(colls))
	for _, c := range colls {
		for i := range c.Shards {
			if l, ok := leaders[c.Shards[i].ID]; ok && l != 0 {
				c.Shards[i].Leader = l
			}
		}
		m[c.Name] = c
	}
	r.mu.Lock()
	r.mu.nodes, r.mu.colls, r.mu.fetched = nodes, m, time.Now()
	r.mu.Unlock()
}

// stale marks the map for a refresh on the next call.
func (r *router) stale() {
	r.mu.Lock()
	r.mu.fetched = time.Time{}
	r.mu.Unlock()
}

// target returns the DB that serves key of coll best: its shard leader's
// node, or the dialed node when that is unknown.
func (r *router) target(coll string, key []byte) *remoteDB {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return r.seed
	}
	if time.Since(r.mu.fetched) > routeMaxAge && !r.mu.refreshing {
		r.mu.refreshing = true
		go r.refresh()
	}
	c, ok := r.mu.colls[coll]
	if !ok || len(c.Shards) == 0 {
		return r.seed
	}
	var s *kv.ShardInfo
	switch c.Partitioning {
	case kv.PartitionHash:
		b := uint32(cluster.Bucket(key))
		i := sort.Search(len(c.Shards), func(i int) bool { return c.Shards[i].BucketEnd > b })
		if i < len(c.Shards) {
			s = &c.Shards[i]
		}
	case kv.PartitionRange:
		i := sort.Search(len(c.Shards), func(i int) bool {
			return c.Shards[i].End != nil && bytes.Compare(c.Shards[i].End, key) > 0
		})
		if i < len(c.Shards) {
			s = &c.Shards[i]
		}
	}
	if s == nil || s.Leader == 0 {
		return r.seed
	}
	addr, ok := r.mu.nodes[s.Leader]
	if !ok || addr == r.seedAddr {
		return r.seed
	}
	if db, ok := r.mu.conns[addr]; ok {
		return db
	}
	db, err := Dial(addr, withoutRouting(r.opts))
	if err != nil {
		return r.seed
	}
	rdb := db.(*remoteDB)
	r.mu.conns[addr] = rdb
	return rdb
}

func (r *router) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.closed = true
	for _, c := range r.mu.conns {
		c.Close()
	}
	r.mu.conns = nil
	return nil
}

// withoutRouting gives a node connection the client's options, unrouted.
func withoutRouting(o dialOptions) DialOption {
	return func(d *dialOptions) {
		*d = o
		d.timeout = 0
		d.noRouting = true
	}
}

// routed runs op on key's leader, and once more on the dialed node if the
// leader refused it (nothing was done).
func routed[T any](d *routedDB, coll string, key []byte, op func(*remoteDB) (T, error)) (T, error) {
	t := d.r.target(coll, key)
	v, err := op(t)
	if err == nil || t == d.r.seed {
		return v, err
	}
	switch kv.CodeOf(err) {
	case kv.CodeUnavailable, kv.CodeNotLeader:
		d.r.stale()
		return op(d.r.seed)
	}
	return v, err
}

func (d *routedDB) Put(ctx context.Context, req PutRequest) (uint64, error) {
	return routed(d, req.Collection, req.Key, func(db *remoteDB) (uint64, error) { return db.Put(ctx, req) })
}

func (d *routedDB) Get(ctx context.Context, req GetRequest) (Record, error) {
	return routed(d, req.Collection, req.Key, func(db *remoteDB) (Record, error) { return db.Get(ctx, req) })
}

func (d *routedDB) Delete(ctx context.Context, req DeleteRequest) (uint64, error) {
	return routed(d, req.Collection, req.Key, func(db *remoteDB) (uint64, error) { return db.Delete(ctx, req) })
}

func (d *routedDB) Close() error {
	err := d.remoteDB.Close()
	d.r.close()
	return err
}

func (d *routedDB) String() string {
	return fmt.Sprintf("groupkv remote DB at %s (routed)", d.r.seedAddr)
}

// Group transactions run where the group's state is: on the node that
// leads the shard of the group's leader key. The client learns a group's
// leader key from a CreateGroup through it, else from one DescribeGroup,
// and keeps it for groupLeaderMaxAge (at most maxGroupLeaders groups); a
// stale or unknown one costs a hop (the node forwards), never an error.

const (
	groupLeaderMaxAge = time.Minute
	maxGroupLeaders   = 4096
)

type groupLeader struct {
	key     KeyRef
	learned time.Time
}

func (r *router) groupLeader(id string) (KeyRef, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.mu.groups[id]
	if !ok || time.Since(l.learned) > groupLeaderMaxAge {
		return KeyRef{}, false
	}
	return l.key, true
}

func (r *router) setGroupLeader(id string, key KeyRef) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.groups == nil {
		r.mu.groups = make(map[string]groupLeader)
	}
	if len(r.mu.groups) >= maxGroupLeaders {
		for k := range r.mu.groups {
			delete(r.mu.groups, k) // any one: a miss costs one DescribeGroup
			break
		}
	}
	r.mu.groups[id] = groupLeader{key: key, learned: time.Now()}
}

func (r *router) forgetGroup(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.mu.groups, id)
}

// groupTarget returns the DB that serves group id's transactions best.
func (d *routedDB) groupTarget(ctx context.Context, id string) *remoteDB {
	key, ok := d.r.groupLeader(id)
	if !ok {
		info, err := d.remoteDB.DescribeGroup(ctx, id)
		if err != nil {
			return d.r.seed
		}
		key = info.Leader
		d.r.setGroupLeader(id, key)
	}
	return d.r.target(key.Collection, key.Key)
}

// Group returns a handle whose transactions run on the node leading the
// group, each attempt begun there, so that its reads and its commit skip
// the hop from the dialed node. Exec of the group goes the same way.
func (d *routedDB) Group(id string) *Group {
	g := d.remoteDB.Group(id)
	g.start = func(id string) startFunc {
		return func(ctx context.Context, opts kv.TxnOptions) (txnAttempt, error) {
			return d.groupTarget(ctx, id).start(id)(ctx, opts)
		}
	}
	g.exec = func(ctx context.Context, req ExecRequest) (ExecResult, error) {
		t := d.groupTarget(ctx, id)
		res, err := t.txn.ExecGroupTxn(ctx, id, req)
		if err != nil && t != d.r.seed && (kv.CodeOf(err) == kv.CodeUnavailable || kv.CodeOf(err) == kv.CodeNotLeader) {
			d.r.stale()
			return d.remoteDB.txn.ExecGroupTxn(ctx, id, req)
		}
		return res, err
	}
	return g
}

// CreateGroup asks the node leading the shard of the group's leader key,
// where the group is created, saving the dialed node's hop (a creation
// asked again goes on with the group the first one created).
func (d *routedDB) CreateGroup(ctx context.Context, spec GroupSpec) (GroupCreated, error) {
	created, err := routed(d, spec.Leader.Collection, spec.Leader.Key, func(db *remoteDB) (GroupCreated, error) {
		return db.CreateGroup(ctx, spec)
	})
	if err == nil {
		d.r.setGroupLeader(spec.ID, spec.Leader)
	}
	return created, err
}

// DeleteGroup asks the node leading the group, if the client knows its
// leader key, else the dialed node. Only a refusal (not_leader) is asked
// again through the dialed node: an unavailable deletion may have begun,
// and asked again after its registration is gone it would answer
// not_found, not wait for it.
func (d *routedDB) DeleteGroup(ctx context.Context, id string) error {
	key, ok := d.r.groupLeader(id)
	d.r.forgetGroup(id)
	if !ok {
		return d.remoteDB.DeleteGroup(ctx, id)
	}
	t := d.r.target(key.Collection, key.Key)
	err := t.DeleteGroup(ctx, id)
	if err != nil && t != d.r.seed && kv.CodeOf(err) == kv.CodeNotLeader {
		d.r.stale()
		return d.remoteDB.DeleteGroup(ctx, id)
	}
	return err
}
