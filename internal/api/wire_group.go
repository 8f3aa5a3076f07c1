package api

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/groupkv/groupkv/internal/kv"
)

// The JSON shapes of the Key Groups forms of the HTTP API (http_group.go),
// shared with the Go client and the command-line client. Keys are put in
// JSON as in the multi-record forms (see http_multi.go): key, or
// key_base64 for a key that is not UTF-8.

// MaxGroupIDSize bounds a group id, in bytes: an id names a group in paths
// and messages, so it is short text, not data.
const MaxGroupIDSize = 256

// ValidateGroupID reports whether id can name a group: 1 to MaxGroupIDSize
// bytes of UTF-8 without control characters. Its errors are *kv.Error with
// code invalid_argument.
func ValidateGroupID(id string) error {
	switch {
	case id == "":
		return kv.Errorf(kv.CodeInvalidArgument, `no group id: give "id", 1 to %d bytes of UTF-8`, MaxGroupIDSize)
	case len(id) > MaxGroupIDSize:
		return kv.Errorf(kv.CodeInvalidArgument, "group id is %d bytes, the limit is %d", len(id), MaxGroupIDSize)
	case !utf8.ValidString(id):
		return kv.Errorf(kv.CodeInvalidArgument, "group id %q is not UTF-8", clip(id))
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return kv.Errorf(kv.CodeInvalidArgument, "group id %q holds a control character", clip(id))
		}
	}
	return nil
}

// GroupKeyJSON is a member key of a group: its collection, and key or
// key_base64. It is the key of a request and of an answer alike.
type GroupKeyJSON struct {
	Collection string `json:"collection"`
	KeyJSON
}

const groupKeyFields = "collection, key, key_base64"

// ToGroupKeyJSON returns ref on the wire.
func ToGroupKeyJSON(ref kv.KeyRef) GroupKeyJSON {
	return GroupKeyJSON{Collection: ref.Collection, KeyJSON: ToKeyJSON(ref.Key)}
}

// toKeyRef validates k.
func (k GroupKeyJSON) toKeyRef() (kv.KeyRef, error) {
	return KeyRefJSON{Collection: k.Collection, Key: k.Key, KeyBase64: k.KeyBase64}.toKeyRef()
}

func toGroupKeysJSON(refs []kv.KeyRef) []GroupKeyJSON {
	out := make([]GroupKeyJSON, len(refs))
	for i, ref := range refs {
		out[i] = ToGroupKeyJSON(ref)
	}
	return out
}

// groupKeysFromJSON returns the keys of an answer, for a client; name is
// the list, for messages.
func groupKeysFromJSON(name string, keys []GroupKeyJSON) ([]kv.KeyRef, error) {
	out := make([]kv.KeyRef, len(keys))
	for i, k := range keys {
		key, _, err := BytesFromJSON("key", k.Key, k.KeyBase64)
		if err != nil {
			return nil, at(fmt.Sprintf("%s[%d]", name, i), err)
		}
		out[i] = kv.KeyRef{Collection: k.Collection, Key: key}
	}
	return out, nil
}

// GroupCreateRequestJSON is the body of POST /v1/groups: the group's id,
// its leader key, its members (the leader among them or not) and its mode,
// "atomic" (also when empty) or "best_effort".
type GroupCreateRequestJSON struct {
	ID      string         `json:"id"`
	Leader  *GroupKeyJSON  `json:"leader,omitempty"`
	Members []GroupKeyJSON `json:"members"`
	Mode    kv.GroupMode   `json:"mode,omitempty"`
}

const groupCreateFields = "id, leader, members, mode"

// GroupSpecFromJSON validates req: the id, every key, the mode, and that
// no key is listed twice (the leader may be listed among the members).
// Its errors are *kv.Error with code invalid_argument, their messages
// naming the element, as "members[2]".
func GroupSpecFromJSON(req GroupCreateRequestJSON) (kv.GroupSpec, error) {
	if err := ValidateGroupID(req.ID); err != nil {
		return kv.GroupSpec{}, err
	}
	if req.Leader == nil {
		return kv.GroupSpec{}, kv.Errorf(kv.CodeInvalidArgument,
			`no leader: give "leader": {"collection": ..., "key": ...}, the key whose shard's leader will own the group`)
	}
	leader, err := req.Leader.toKeyRef()
	if err != nil {
		return kv.GroupSpec{}, at("leader", err)
	}
	mode, err := groupMode(req.Mode)
	if err != nil {
		return kv.GroupSpec{}, err
	}
	spec := kv.GroupSpec{ID: req.ID, Leader: leader, Members: make([]kv.KeyRef, len(req.Members)), Mode: mode}
	seen := make(map[string]int, len(req.Members))
	n := len(leader.Key)
	for i, m := range req.Members {
		ref, err := m.toKeyRef()
		if err != nil {
			return kv.GroupSpec{}, at(fmt.Sprintf("members[%d]", i), err)
		}
		if err := checkMemberOnce(seen, i, ref); err != nil {
			return kv.GroupSpec{}, err
		}
		spec.Members[i] = ref
		n += len(ref.Key)
	}
	return spec, checkRequestBytes(n)
}

// groupMode checks the mode of a group's creation; empty is atomic.
func groupMode(mode kv.GroupMode) (kv.GroupMode, error) {
	switch mode {
	case "":
		return kv.GroupAtomic, nil
	case kv.GroupAtomic, kv.GroupBestEffort:
		return mode, nil
	}
	return "", kv.Errorf(kv.CodeInvalidArgument, "mode %q is not known: use %q (the default: every key joins or none) or %q (the keys that can join do)",
		clip(string(mode)), kv.GroupAtomic, kv.GroupBestEffort)
}

// checkMemberOnce refuses members[i], ref, when an earlier member is the
// same key; seen maps collection and key to the index of the member that
// named them first, and gets ref.
func checkMemberOnce(seen map[string]int, i int, ref kv.KeyRef) error {
	k := ref.Collection + "\x00" + string(ref.Key)
	if j, ok := seen[k]; ok {
		return kv.Errorf(kv.CodeInvalidArgument, "members[%d] is members[%d] again (collection %q, key %s): list each key once",
			i, j, ref.Collection, quoteKey(ref.Key))
	}
	seen[k] = i
	return nil
}

// ToGroupCreateRequestJSON returns spec on the wire, for a client.
func ToGroupCreateRequestJSON(spec kv.GroupSpec) GroupCreateRequestJSON {
	leader := ToGroupKeyJSON(spec.Leader)
	return GroupCreateRequestJSON{ID: spec.ID, Leader: &leader, Members: toGroupKeysJSON(spec.Members), Mode: spec.Mode}
}

// GroupRefusalJSON is a key that would not join a group, and why
// ("intent", "locked", "in_group").
type GroupRefusalJSON struct {
	Collection string `json:"collection"`
	KeyJSON
	Reason string `json:"reason"`
}

// GroupCreatedJSON answers POST /v1/groups: joined lists every key the
// group holds, the leader included; refused (best_effort) the keys that
// did not join. Neither is ever null.
type GroupCreatedJSON struct {
	ID      string             `json:"id"`
	Joined  []GroupKeyJSON     `json:"joined"`
	Refused []GroupRefusalJSON `json:"refused"`
}

// ToGroupCreatedJSON returns c on the wire.
func ToGroupCreatedJSON(c kv.GroupCreated) GroupCreatedJSON {
	out := GroupCreatedJSON{ID: c.ID, Joined: toGroupKeysJSON(c.Joined), Refused: make([]GroupRefusalJSON, len(c.Refused))}
	for i, r := range c.Refused {
		out.Refused[i] = GroupRefusalJSON{Collection: r.Collection, KeyJSON: ToKeyJSON(r.Key), Reason: r.Reason}
	}
	return out
}

// GroupCreatedFromJSON returns the outcome a server answered, for a
// client.
func GroupCreatedFromJSON(resp GroupCreatedJSON) (kv.GroupCreated, error) {
	joined, err := groupKeysFromJSON("joined", resp.Joined)
	if err != nil {
		return kv.GroupCreated{}, err
	}
	out := kv.GroupCreated{ID: resp.ID, Joined: joined, Refused: make([]kv.GroupRefusal, len(resp.Refused))}
	for i, r := range resp.Refused {
		key, _, err := BytesFromJSON("key", r.Key, r.KeyBase64)
		if err != nil {
			return kv.GroupCreated{}, at(fmt.Sprintf("refused[%d]", i), err)
		}
		out.Refused[i] = kv.GroupRefusal{KeyRef: kv.KeyRef{Collection: r.Collection, Key: key}, Reason: r.Reason}
	}
	return out, nil
}

// GroupInfoJSON answers GET /v1/groups/{id}, and is an element of the
// answer of GET /v1/groups: members lists every key the group holds (or
// is taking, or giving back), the leader included; leader_node is the
// node leading the group's leader shard; state is "creating", "active" or
// "deleting"; shipper_lag is the number of committed group writes not yet
// applied to their keys' own shards.
type GroupInfoJSON struct {
	ID         string         `json:"id"`
	Leader     GroupKeyJSON   `json:"leader"`
	Members    []GroupKeyJSON `json:"members"`
	Mode       kv.GroupMode   `json:"mode"`
	LeaderNode uint64         `json:"leader_node"`
	State      string         `json:"state"`
	ShipperLag int            `json:"shipper_lag"`
}

// ToGroupInfoJSON returns info on the wire; an empty mode is atomic.
func ToGroupInfoJSON(info kv.GroupInfo) GroupInfoJSON {
	mode := info.Mode
	if mode == "" {
		mode = kv.GroupAtomic
	}
	return GroupInfoJSON{ID: info.ID, Leader: ToGroupKeyJSON(info.Leader), Members: toGroupKeysJSON(info.Members),
		Mode: mode, LeaderNode: info.LeaderNode, State: info.State, ShipperLag: info.ShipperLag}
}

// GroupInfoFromJSON returns the description a server answered, for a
// client.
func GroupInfoFromJSON(g GroupInfoJSON) (kv.GroupInfo, error) {
	leader, err := groupKeysFromJSON("leader", []GroupKeyJSON{g.Leader})
	if err != nil {
		return kv.GroupInfo{}, err
	}
	members, err := groupKeysFromJSON("members", g.Members)
	if err != nil {
		return kv.GroupInfo{}, err
	}
	return kv.GroupInfo{ID: g.ID, Leader: leader[0], Members: members, Mode: g.Mode,
		LeaderNode: g.LeaderNode, State: g.State, ShipperLag: g.ShipperLag}, nil
}

// GroupListJSON answers GET /v1/groups; groups is never null.
type GroupListJSON struct {
	Groups []GroupInfoJSON `json:"groups"`
}

// ToGroupListJSON returns infos on the wire.
func ToGroupListJSON(infos []kv.GroupInfo) GroupListJSON {
	out := GroupListJSON{Groups: make([]GroupInfoJSON, len(infos))}
	for i, info := range infos {
		out.Groups[i] = ToGroupInfoJSON(info)
	}
	return out
}

// GroupListFromJSON returns the groups a server answered, for a client.
func GroupListFromJSON(l GroupListJSON) ([]kv.GroupInfo, error) {
	out := make([]kv.GroupInfo, len(l.Groups))
	for i, g := range l.Groups {
		info, err := GroupInfoFromJSON(g)
		if err != nil {
			return nil, at(fmt.Sprintf("groups[%d]", i), err)
		}
		out[i] = info
	}
	return out, nil
}
