package kv

import (
	"strings"
	"testing"
)

func TestValidateCollectionName(t *testing.T) {
	for _, ok := range []string{"a", "users", "a.b-c_d9", strings.Repeat("x", 64)} {
		if err := ValidateCollectionName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "A", "a b", "a/b", "é", strings.Repeat("x", 65), "a\x00"} {
		if err := ValidateCollectionName(bad); CodeOf(err) != CodeInvalidArgument {
			t.Errorf("%q: %v, want invalid_argument", bad, err)
		}
	}
}

func TestValidateTags(t *testing.T) {
	if err := ValidateTags([]string{"a", "b é"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{{""}, {"a,b"}, {"a\n"}, {"a", "a"}, {strings.Repeat("t", MaxTagSize+1)}, {string([]byte{0xff})}, make([]string, MaxTags+1)} {
		if err := ValidateTags(bad); CodeOf(err) != CodeInvalidArgument {
			t.Errorf("%q: %v, want invalid_argument", bad, err)
		}
	}
}

func TestValidateGroupID(t *testing.T) {
	for _, c := range []struct {
		id   string
		says string // "": valid
	}{
		{"match-1", ""},
		{"team b ✓", ""},
		{strings.Repeat("g", MaxGroupIDSize), ""},
		{"", "1 to 256 bytes"},
		{strings.Repeat("g", MaxGroupIDSize+1), "got 257"},
		{"a\xffb", "not UTF-8"},
		{"a\nb", "control character"},
		{"a\x7fb", "control character"},
	} {
		err := ValidateGroupID(c.id)
		if c.says == "" && err != nil || c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says) || CodeOf(err) != CodeInvalidArgument) {
			t.Errorf("ValidateGroupID(%q) = %v, want %q", c.id, err, c.says)
		}
	}
}
