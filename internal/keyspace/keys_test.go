package keyspace

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
)

// TestNamesPinned pins the names this package builds, byte for byte: state
// already in Redis is found again only under the same names. The keys of
// rules and descriptors as a check builds them are pinned in package
// engine (TestStoreKeysPinned).
func TestNamesPinned(t *testing.T) {
	long := strings.Repeat("x", 600)
	for _, tt := range []struct{ got, want string }{
		{LayoutTag(sluice.TokenBucket, "1m0s", 1), "tb.1m0s"},
		{LayoutTag(sluice.SlidingWindowCounter, "24h0m0s", 10), "swc.24h0m0s.q10"},
		{LayoutTag(sluice.FixedWindow, "1s", 1000), "fw.1s.q1000"},
		{LayoutTag(sluice.GCRA, "1s", 1), "gcra.1s"},
		{LayoutTag(sluice.LeakyBucket, "1s", 1), "lb.1s"},
		{LayoutTag(sluice.SlidingWindowLog, "1h0m0s", 1), "swl.1h0m0s"},
		{RulePrefix("orders-per-user"), "rl:orders-per-user:"},
		{string(CloseHashTag(AppendEscaped(AppendDimension(nil, 0, "user"), "a:b{c}%\x01\x7f"))), "{user=a%3Ab%7Bc%7D%25%01%7F}"},
		{string(AppendDimension([]byte("x"), 1, "endpoint")), "x:endpoint="},
		{EnvoyPrefix("edge:1", "fw.1m0s"), "rl:envoy:edge%3A1:fw.1m0s:"},
		{EnvoyPrefix("edge", GlobalTag), "rl:envoy:edge:@g:"},
		{EnvoyOverridePrefix("edge", "fw.1m0s.q1000"), "rl:envoy:edge:override.fw.1m0s.q1000:"},
		{string(CloseHashTag(AppendEnvoyEntry(AppendEnvoyEntry(nil, 0, "a=b=c", "d:e"), 1, "k", "v"))), "{a%3Db%3Dc=d%3Ae:k=v}"},
		{Idempotency("acme", "order:7", 0xd699d71d90216394), "rl:idem:{acme}:order%3A7:d699d71d90216394"},
		{Idempotency("a{b}", "\x01%", 1), "rl:idem:{a%7Bb%7D}:\x01%25:0000000000000001"},
		{ReadyKey, "rl:_ready"},
		{WarmKey(31), "rl:_warm:{31}"},
		{OnSlot(Slot("rl:r:tb.1s:{user=42}"), "idem"), "{7386}:idem"},
		{strings.Join(PoolKeys("p:", "0123456789abcdef"), " "), "p:rsv:{0123456789abcdef}:p p:rsv:{0123456789abcdef}:g p:rsv:{0123456789abcdef}:x"},
		{PoolRegistry("p:"), "p:rsv:pools"},
		{Redis("p:", "rl:r:tb.1s:{user=42}:x", 512), "p:rl:r:tb.1s:{user=42}:x"},
		{Redis("p:", "rl:r:tb.1s:{user=42}:"+long, 512), "p:{user=42}#ca266cc8cbd9fc64e181edb20cd4ac6cdd59e4ebda7a5ffaa821411d64ec1cf3"},
		{Redis("p:", "rl:r:tb.1s:{"+strings.Repeat("u", 100)+"}:"+long, 512), "p:{5911}#d159853f8a572bbcd4a01e13320b94d600ff9b8a54e94e07f73b2b29315b0fdd"},
		{Redis("", long, 512), "#5130b33e6b87fbf5316ed9049e98924eb110800bcbaaad8050f642fba6df37c9"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestShorten(t *testing.T) {
	short := []byte("rl:r:tb.1s:{user=42}:endpoint=/a")
	if got := Shorten(short, 0); string(got) != string(short) {
		t.Errorf("Shorten(short) = %q", got)
	}
	key := []byte("pre|rl:r:tb.1s:{user=42}:endpoint=/" + strings.Repeat("a", MaxKeyBytes))
	got := string(Shorten(key, len("pre|")))
	if !strings.HasPrefix(got, "pre|rl:r:tb.1s:{user=42}#") || len(got) != len("pre|rl:r:tb.1s:{user=42}#")+64 {
		t.Errorf("Shorten(long) = %q", got)
	}
	if Slot(got[len("pre|"):]) != Slot("rl:r:tb.1s:{user=42}") {
		t.Errorf("Shorten(long) moved the key off its slot")
	}
	tag := strings.Repeat("t", 65)
	got = string(Shorten([]byte("rl:r:x:{"+tag+"}:"+strings.Repeat("a", MaxKeyBytes)), 0))
	if !strings.HasPrefix(got, "rl:r:x:{"+SlotTag(TagSlot(tag))+"}#") {
		t.Errorf("Shorten(long tag) = %q", got)
	}
	src := "rl:r:tb.1s:{user=42}:endpoint=/" + strings.Repeat("a", MaxKeyBytes)
	buf := make([]byte, 0, 2*len(src))
	if n := testing.AllocsPerRun(100, func() { Shorten(append(buf[:0], src...), 0) }); n != 0 {
		t.Errorf("Shorten allocates %v times", n)
	}
}
