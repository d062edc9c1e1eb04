package keyspace

import "testing"

func TestSlot(t *testing.T) {
	// Known slots (from CLUSTER KEYSLOT).
	for k, want := range map[string]uint16{"foo": 12182, "{user1000}.following": 3443, "bar": 5061,
		"{}foo": 9500, "foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "foo{bar}{zap}": 5061} {
		if got := Slot(k); got != want {
			t.Errorf("Slot(%q) = %d, want %d", k, got, want)
		}
	}
}

func TestHashTag(t *testing.T) {
	for _, tt := range []struct {
		key, tag string
		ok       bool
	}{
		{"rl:r:{user=42}:x", "user=42", true},
		{"{a}{b}", "a", true},
		{"{{a}}", "{a", true},
		{"{}a", "", false},
		{"a}{", "", false},
		{"plain", "", false},
	} {
		tag, ok := HashTag(tt.key)
		if tag != tt.tag || ok != tt.ok {
			t.Errorf("HashTag(%q) = %q, %v; want %q, %v", tt.key, tag, ok, tt.tag, tt.ok)
		}
		btag, bok := HashTag([]byte(tt.key))
		if string(btag) != tt.tag || bok != tt.ok {
			t.Errorf("HashTag([]byte(%q)) = %q, %v; want %q, %v", tt.key, btag, bok, tt.tag, tt.ok)
		}
	}
}

func TestSlotTag(t *testing.T) {
	for sl := range uint16(Slots) {
		tag := SlotTag(sl)
		if Slot("{"+tag+"}") != sl || len(tag) > 6 {
			t.Fatalf("SlotTag(%d) = %q, which is on slot %d", sl, tag, Slot("{"+tag+"}"))
		}
	}
}
