package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis drives Redis through github.com/redis/go-redis/v9: GET and SET, and
// for scans the scheme of YCSB's redis binding: every insert also adds its
// key to a sorted set, and a scan reads the next keys from that set, then
// their values with one MGET. Members all have score 0, so the set is in
// key order and ZRANGE BYLEX walks it like the other systems' scans.
// Records are the keys "<table>:<key>", the index is "<table>:index".
type Redis struct {
	c      *redis.Client
	prefix string
	index  string
}

var _ Driver = (*Redis)(nil)

// OpenRedis connects to the Redis server at addr and checks it answers.
func OpenRedis(ctx context.Context, addr string, opts DriverOptions) (*Redis, error) {
	opts.EnsureDefaults()
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		PoolSize:        opts.Conns,
		DialTimeout:     opts.DialTimeout,
		DisableIdentity: true, // CLIENT SETINFO needs Redis 7.2
	})
	pctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("connecting to redis at %s: %w", addr, err)
	}
	return &Redis{c: c, prefix: opts.Table + ":", index: opts.Table + ":index"}, nil
}

func (r *Redis) System() string { return "redis" }

// ServerCPU implements CPUMeter: used_cpu_sys + used_cpu_user of INFO cpu.
func (r *Redis) ServerCPU(ctx context.Context) (time.Duration, error) {
	info, err := r.c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	return parseRedisCPU(info)
}

func (r *Redis) Version(ctx context.Context) (string, error) {
	info, err := r.c.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "redis_version:"); ok {
			return v, nil
		}
	}
	return "", errors.New("bench: INFO server has no redis_version")
}

func (r *Redis) key(k []byte) string { return r.prefix + string(k) }

// Reset deletes the records (the keys under the prefix, found with SCAN)
// and the index.
func (r *Redis) Reset(ctx context.Context) error {
	var cursor uint64
	for {
		keys, next, err := r.c.Scan(ctx, cursor, r.prefix+"*", 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := r.c.Unlink(ctx, keys...).Err(); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

func (r *Redis) Check(ctx context.Context) error {
	n, err := r.c.ZCard(ctx, r.index).Result()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w (redis index %q)", ErrNotLoaded, r.index)
	}
	return nil
}

func (r *Redis) Load(ctx context.Context, keys, values [][]byte) error {
	pairs := make([]any, 0, 2*len(keys))
	members := make([]redis.Z, len(keys))
	for i := range keys {
		pairs = append(pairs, r.key(keys[i]), values[i])
		members[i] = redis.Z{Member: string(keys[i])}
	}
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.MSet(ctx, pairs...)
		p.ZAdd(ctx, r.index, members...)
		return nil
	})
	return err
}

func (r *Redis) Read(ctx context.Context, key []byte) error {
	err := r.c.Get(ctx, r.key(key)).Err()
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return err
}

func (r *Redis) Update(ctx context.Context, key, value []byte) error {
	return r.c.Set(ctx, r.key(key), value, 0).Err()
}

// Insert sets the record and indexes its key, in one pipelined round trip.
func (r *Redis) Insert(ctx context.Context, key, value []byte) error {
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, r.key(key), value, 0)
		p.ZAdd(ctx, r.index, redis.Z{Member: string(key)})
		return nil
	})
	return err
}

func (r *Redis) Scan(ctx context.Context, key []byte, n int) (int, error) {
	members, err := r.c.ZRangeArgs(ctx, redis.ZRangeArgs{
		Key: r.index, Start: "[" + string(key), Stop: "+", ByLex: true, Count: int64(n),
	}).Result()
	if err != nil || len(members) == 0 {
		return 0, err
	}
	keys := make([]string, len(members))
	for i, m := range members {
		keys[i] = r.prefix + m
	}
	vals, err := r.c.MGet(ctx, keys...).Result()
	return len(vals), err
}

func (r *Redis) Close() error { return r.c.Close() }
