package kv

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Outcomes of a replica consistency check (ConsistencyCheck.Status).
const (
	// ConsistencyOK: every replica answered with the same sum.
	ConsistencyOK = "ok"
	// ConsistencyMismatch: two replicas answered with different sums.
	ConsistencyMismatch = "mismatch"
	// ConsistencyIncomplete: the answers agree but a replica did not
	// answer, or the check could not be run at all (Errors says why).
	ConsistencyIncomplete = "incomplete"
)

// ConsistencyCheck is the outcome of one replica consistency check of a
// shard: its replicas summed their state at one log index and the sums were
// compared.
type ConsistencyCheck struct {
	Shard uint64 `json:"shard"`
	// Collection is the shard's collection ("" for the meta shard); it is
	// filled where the check was asked for by name, not by the peers that
	// hear of an outcome.
	Collection string `json:"collection,omitempty"`
	// ID names the check's KindChecksum entry (0: no entry was proposed);
	// Index is its log index (0: no replica answered).
	ID    uint64 `json:"id"`
	Index uint64 `json:"index,omitempty"`
	// Status is ConsistencyOK, ConsistencyMismatch or ConsistencyIncomplete.
	Status string `json:"status"`
	// Replicas are the nodes asked, Sums their answers (hex) by node.
	Replicas []uint64          `json:"replicas"`
	Sums     map[uint64]string `json:"sums,omitempty"`
	// Mismatched are the nodes whose sum is not the majority's (every node
	// that answered when no sum has a majority).
	Mismatched []uint64 `json:"mismatched,omitempty"`
	// Missing are the nodes that did not answer; Errors says why, names
	// replicas whose node is unknown, and says why a check that could not
	// be run was not.
	Missing []uint64 `json:"missing,omitempty"`
	Errors  []string `json:"errors,omitempty"`
	// By is the node that ran the check, At when it ended.
	By uint64    `json:"by"`
	At time.Time `json:"at"`
}

// Summary is the outcome as cluster status shows it: "ok", "mismatch: ..."
// naming the diverged replicas, or "incomplete".
func (c ConsistencyCheck) Summary() string {
	if c.Status != ConsistencyMismatch {
		return c.Status
	}
	agree := make([]uint64, 0, len(c.Sums))
	for id := range c.Sums {
		if !containsID(c.Mismatched, id) {
			agree = append(agree, id)
		}
	}
	sort.Slice(agree, func(i, j int) bool { return agree[i] < agree[j] })
	if len(agree) == 0 {
		return fmt.Sprintf("mismatch: at index %d %s disagree", c.Index, nodeList(c.Mismatched))
	}
	verb := "differs"
	if len(c.Mismatched) > 1 {
		verb = "differ"
	}
	return fmt.Sprintf("mismatch: at index %d %s %s from %s", c.Index, nodeList(c.Mismatched), verb, nodeList(agree))
}

func containsID(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func nodeList(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	if len(ids) == 1 {
		return "node " + s[0]
	}
	return "nodes " + strings.Join(s, ", ")
}

// ConsistencyChecker is a backend that runs replica consistency checks on
// demand.
type ConsistencyChecker interface {
	// CheckConsistency checks the given shards one after the other, every
	// shard of the cluster (the meta shard first) when none is given, and
	// answers one outcome per shard in that order. An unknown shard fails
	// the call before any check runs; a shard whose check could not be run
	// (no leader, say) has the outcome ConsistencyIncomplete with the
	// reason in its Errors.
	CheckConsistency(ctx context.Context, shards []uint64) ([]ConsistencyCheck, error)
}
