package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	groupkv "github.com/groupkv/groupkv"
	"github.com/groupkv/groupkv/internal/kv"
)

// The timeline workload measures correlated reads, the point of DataDroplets
// (Vilaça et al.): an application that reads groups of records together —
// one user's timeline — gains when a group lives in one shard. Users users
// each have PerUser records tagged with the user's tag; each operation reads
// one user's whole timeline with GetByTags(all=[tag]). Run against a tag
// collection (placement by the tag: one shard per user) and a hash
// collection (the records of a user spread over every shard), it shows what
// placement buys. Only groupkv runs it.

// TimelineOp is the name of the timeline workload's operation in results.
const TimelineOp = "timeline"

// TimelineWorkload returns the workload name of a timeline run on a
// collection partitioned by partitioning: "timeline-tag", "timeline-hash".
func TimelineWorkload(partitioning string) string { return "timeline-" + partitioning }

// timelineCollection is the collection of a timeline run.
func timelineCollection(partitioning string) string { return "timeline_" + partitioning }

func userTag(u int) string { return "user" + strconv.Itoa(u) }

func timelineKey(u, i int) []byte {
	return fmt.Appendf(nil, "u%08d/%06d", u, i)
}

// RunTimeline runs the timeline workload on the groupkv collection
// "timeline_<partitioning>" (groupkv.PartitionTag or PartitionHash). With
// load it first recreates the collection with Shards shards (0: groupkv's
// default) and writes Users×PerUser records, one BatchPut per user;
// without, the collection must hold them. The request distribution over
// users is Options.Distribution, zipfian by default.
func (r *Runner) RunTimeline(ctx context.Context, partitioning groupkv.Partitioning, load bool) (Result, error) {
	g, ok := r.d.(*GroupKV)
	if !ok {
		return Result{}, fmt.Errorf("%w: the timeline workload runs against groupkv only, not %s", ErrInvalidOptions, r.d.System())
	}
	switch partitioning {
	case groupkv.PartitionTag, groupkv.PartitionHash:
	default:
		return Result{}, fmt.Errorf("%w: timeline partitioning %q: use tag or hash", ErrInvalidOptions, partitioning)
	}
	dist := r.opts.Distribution
	switch dist {
	case "":
		dist = DistZipfian
	case DistLatest:
		return Result{}, fmt.Errorf("%w: the timeline workload has no insert order: use uniform or zipfian", ErrInvalidOptions)
	}
	coll := timelineCollection(string(partitioning))
	users, perUser := r.opts.Users, r.opts.PerUser
	var lr *LoadResult
	if load {
		l, err := r.loadTimeline(ctx, g, coll, partitioning)
		if err != nil {
			return Result{}, err
		}
		lr = &l
	} else if res, err := g.DB().GetByTags(ctx, groupkv.TagQuery{Collection: coll, All: []string{userTag(0)}, Limit: 1}); err != nil || len(res.Items) == 0 {
		if err != nil && !errors.Is(err, groupkv.ErrCollectionNotFound) {
			return Result{}, err
		}
		return Result{}, fmt.Errorf("%w (groupkv collection %q)", ErrNotLoaded, coll)
	}
	version, err := r.d.Version(ctx)
	if err != nil {
		return Result{}, err
	}
	page := min(perUser, kv.MaxPageSize)
	res, err := r.loop(ctx, TimelineWorkload(string(partitioning)), []string{TimelineOp}, func(c *client) stepFunc {
		var chooser Chooser = NewScrambledZipfian(uint64(users))
		if dist == DistUniform {
			chooser = Uniform{N: uint64(users)}
		}
		return func(ctx context.Context) error {
			u := int(chooser.Next(c.rng))
			return c.do(0, func() error {
				q := groupkv.TagQuery{Collection: coll, All: []string{userTag(u)}, Limit: page}
				n := 0
				for {
					res, err := g.dbFor(ctx).GetByTags(ctx, q)
					if err != nil {
						return err
					}
					n += len(res.Items)
					if res.NextPage == "" {
						break
					}
					q.Page = res.NextPage
				}
				if n != perUser {
					return fmt.Errorf("%w: user %d has %d records, loaded %d", ErrShortRead, u, n, perUser)
				}
				return nil
			})
		}
	})
	if err != nil {
		return Result{}, err
	}
	res.System, res.Version, res.Load = r.system(), version, lr
	res.Params.Distribution = dist
	res.Params.Records = users * perUser
	res.Params.Partitioning = string(partitioning)
	res.Params.Users, res.Params.PerUser = users, perUser
	return res, nil
}

// loadTimeline recreates coll and writes the timelines, one batch per user.
func (r *Runner) loadTimeline(ctx context.Context, g *GroupKV, coll string, p groupkv.Partitioning) (LoadResult, error) {
	db := g.DB()
	if err := db.DropCollection(ctx, coll); err != nil && !errors.Is(err, groupkv.ErrCollectionNotFound) {
		return LoadResult{}, fmt.Errorf("dropping collection %q: %w", coll, err)
	}
	if err := createCollection(ctx, db, groupkv.CollectionOptions{Name: coll, Partitioning: p, Shards: r.opts.Shards, Replicas: g.opts.Replicas}); err != nil {
		return LoadResult{}, err
	}
	users, perUser := r.opts.Users, r.opts.PerUser
	total := users * perUser
	var next, done atomic.Int64
	stopProgress := r.progress(func() Status {
		return Status{Phase: "load", Workload: TimelineWorkload(string(p)), Elapsed: time.Duration(done.Load()), Total: time.Duration(total), Ops: done.Load()}
	})
	start := time.Now()
	err := r.parallel(ctx, func(ctx context.Context, id int) error {
		rng := rand.New(rand.NewPCG(r.opts.Seed, uint64(id)))
		for {
			u := int(next.Add(1) - 1)
			if u >= users {
				return nil
			}
			tags := []string{userTag(u)}
			for lo := 0; lo < perUser; lo += kv.DefaultMaxBatchKeys {
				hi := min(lo+kv.DefaultMaxBatchKeys, perUser)
				items := make([]groupkv.PutItem, 0, hi-lo)
				for i := lo; i < hi; i++ {
					v := make([]byte, r.opts.ValueSize)
					fillValue(rng, v)
					items = append(items, groupkv.PutItem{Collection: coll, Key: timelineKey(u, i), Value: v, Tags: tags})
				}
				if _, err := g.dbFor(ctx).BatchPut(ctx, items); err != nil {
					return fmt.Errorf("loading the timeline of user %d: %w", u, err)
				}
				done.Add(int64(hi - lo))
			}
		}
	})
	stopProgress()
	if err != nil {
		return LoadResult{}, err
	}
	secs := time.Since(start).Seconds()
	return LoadResult{Records: total, Seconds: secs, RecordsPer: float64(total) / secs}, nil
}
