package groupkv

import "github.com/groupkv/groupkv/internal/kv"

// EmbeddedForTest returns a DB that calls b in this process, as Open's
// does, without owning it (Close does nothing).
func EmbeddedForTest(b kv.Backend) DB {
	return embedded{Backend: b, close: func() error { return nil }}
}
