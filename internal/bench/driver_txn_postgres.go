package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres drives PostgreSQL through github.com/jackc/pgx/v5: a table
// (k text primary key, v bytea), transactions in BEGIN ISOLATION LEVEL
// SERIALIZABLE, each read a SELECT and each write an INSERT … ON CONFLICT
// DO UPDATE (statements prepared once per connection). An attempt that
// fails with a serialization failure (SQLSTATE 40001) or a deadlock
// (40P01) is rolled back and run again; PostgreSQL has no priorities, so a
// retry is a fresh attempt.
//
// Connections run with enable_seqscan=off (unless the address sets it), so
// that every read is an index scan of the primary key, as the planner
// chooses on a large table with statistics: a sequential scan, which it
// may choose on a table just loaded or still filling, takes a
// relation-level SIREAD lock that makes every pair of serializable
// transactions conflict (PostgreSQL's documentation on serializable
// isolation advises steering the planner to index scans).
//
// The table leaves room on each page (pgFillFactor) for the updates.
type Postgres struct {
	pool  *pgxpool.Pool
	name  string // the table
	table string // name, quoted
	// get, getN and put are the statements of a read, a read of several
	// keys and a write.
	get, getN, put string
}

var _ TxnDriver = (*Postgres)(nil)

// pgFillFactor is the fillfactor of the table: half of each heap page is
// left free when it is loaded, so that an update writes its new version
// on the same page (a HOT update, which adds no index entry), as one sets
// a table that is updated in place. A table loaded full (fillfactor 100,
// PostgreSQL's default) has its rows' first updates move to other pages,
// each adding an entry to the primary key's index, whose leaf pages the
// serializable reads hold SIREAD locks on: at 10,000 keys and 64 clients
// that made about 9 of 10 attempts fail (9.7 attempts per commit, 75
// commits/s, against 1.7 and 379 with fillfactor 50).
const pgFillFactor = 50

// Postgres SQLSTATEs that mean "run the transaction again".
const (
	pgSerializationFailure = "40001"
	pgDeadlockDetected     = "40P01"
)

// OpenPostgres connects to PostgreSQL at dsn, a connection URL or keyword
// string ("postgres://user@127.0.0.1:5432/db?sslmode=disable"), with a pool
// of opts.Conns connections (one per client by default). The table is
// opts.Table.
func OpenPostgres(ctx context.Context, dsn string, opts DriverOptions) (*Postgres, error) {
	opts.EnsureDefaults()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres address %q: %v", ErrInvalidOptions, dsn, err)
	}
	cfg.MaxConns = int32(opts.Conns)
	cfg.MinConns = int32(opts.Conns)
	cfg.ConnConfig.ConnectTimeout = opts.DialTimeout
	if _, ok := cfg.ConnConfig.RuntimeParams["enable_seqscan"]; !ok {
		cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to postgresql at %s: %w", dsn, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to postgresql at %s: %w", dsn, err)
	}
	t := pgx.Identifier{opts.Table}.Sanitize()
	return &Postgres{
		pool:  pool,
		name:  opts.Table,
		table: t,
		get:   "SELECT v FROM " + t + " WHERE k = $1",
		getN:  "SELECT k, v FROM " + t + " WHERE k = ANY($1)",
		put:   "INSERT INTO " + t + " (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
	}, nil
}

// PostgresDSN turns a benchmark address into a connection string: a URL or
// keyword string is kept, host:port becomes
// postgres://postgres@host:port/postgres?sslmode=disable.
func PostgresDSN(addr string) string {
	if strings.Contains(addr, "://") || strings.Contains(addr, "=") {
		return addr
	}
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable"
}

func (p *Postgres) System() string { return "postgresql" }

func (p *Postgres) Version(ctx context.Context) (string, error) {
	var v string
	err := p.pool.QueryRow(ctx, "SHOW server_version").Scan(&v)
	if i := strings.IndexByte(v, ' '); i > 0 {
		v = v[:i] // "15.14 (Debian 15.14-0+deb12u1)"
	}
	return v, err
}

func (p *Postgres) Reset(ctx context.Context) error {
	_, err := p.pool.Exec(ctx, "DROP TABLE IF EXISTS "+p.table+"; CREATE TABLE "+p.table+" (k text PRIMARY KEY, v bytea NOT NULL) WITH (fillfactor = "+fmt.Sprint(pgFillFactor)+")")
	return err
}

func (p *Postgres) Load(ctx context.Context, keys, values [][]byte) error {
	rows := make([][]any, len(keys))
	for i := range keys {
		rows[i] = []any{string(keys[i]), values[i]}
	}
	_, err := p.pool.CopyFrom(ctx, pgx.Identifier{p.name}, []string{"k", "v"}, pgx.CopyFromRows(rows))
	return err
}

// retryable reports whether err asks for the transaction to run again.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == pgSerializationFailure || pe.Code == pgDeadlockDetected)
}

func (p *Postgres) Transact(ctx context.Context, fn func(ctx context.Context, tx Tx) error) (int, error) {
	for attempt := 1; ; attempt++ {
		if err := retryBackoff(ctx, attempt); err != nil {
			return attempt - 1, err
		}
		err := p.attempt(ctx, fn)
		if err == nil {
			return attempt, nil
		}
		if !retryable(err) {
			return attempt, err
		}
	}
}

func (p *Postgres) attempt(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		return err
	}
	if err := fn(ctx, pgTx{p, tx}); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx) // rolls back when it fails
}

// pgQuerier is a transaction or the pool.
type pgQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

type pgTx struct {
	p *Postgres
	q pgQuerier
}

func (t pgTx) Get(ctx context.Context, key []byte) ([]byte, bool, error) {
	var v []byte
	err := t.q.QueryRow(ctx, t.p.get, string(key)).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return v, err == nil, err
}

// GetBatch makes pgTx a BatchReader: one SELECT of the keys.
func (t pgTx) GetBatch(ctx context.Context, keys [][]byte) ([][]byte, []bool, error) {
	names := make([]string, len(keys))
	at := make(map[string]int, len(keys))
	for i, k := range keys {
		names[i] = string(k)
		at[names[i]] = i
	}
	rows, err := t.q.Query(ctx, t.p.getN, names)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	values, found := make([][]byte, len(keys)), make([]bool, len(keys))
	for rows.Next() {
		var k string
		var v []byte
		if err := rows.Scan(&k, &v); err != nil {
			return nil, nil, err
		}
		if i, ok := at[k]; ok {
			values[i], found[i] = v, true
		}
	}
	return values, found, rows.Err()
}

func (t pgTx) Put(ctx context.Context, key, value []byte) error {
	_, err := t.q.Exec(ctx, t.p.put, string(key), value)
	return err
}

// Plain runs each read and write as a transaction of its own (autocommit).
func (p *Postgres) Plain() Tx { return pgTx{p, p.pool} }

func (p *Postgres) Close() error {
	p.pool.Close()
	return nil
}
