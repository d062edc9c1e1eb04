package redis

import (
	"strings"
	"testing"
)

// FuzzParseURL: ParseURL never panics, never quotes a password in its
// errors, and what it accepts has at least one address, a database number
// that is not negative, and no database for a cluster.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"redis://localhost:6380",
		"rediss://u:p%40ss@h:1/3",
		"redis-cluster://a:1,b:2,[fd00::1]",
		"redis-sentinel://s1,s2:26380/mymaster/2",
		"redis-sentinel://:secret@s1/",
		"redis-sentinel://s1/m/x",
		"redis://:se/cret@h:1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		cfg, err := ParseURL(raw)
		if err != nil {
			// The password shows when the error holds it and the error of
			// the URL without it does not (it may be a word of the
			// message, or a part of the URL).
			if pass := password(raw); len(pass) >= 4 && strings.Contains(err.Error(), pass) {
				_, err2 := ParseURL(strings.Replace(raw, ":"+pass+"@", ":@", 1))
				if err2 == nil || !strings.Contains(err2.Error(), pass) {
					t.Errorf("ParseURL(%q): %v shows the password", raw, err)
				}
			}
			return
		}
		if len(cfg.Addrs) == 0 || cfg.DB < 0 {
			t.Errorf("ParseURL(%q) = %+v", raw, cfg)
		}
		if cfg.MasterSet == "" && len(cfg.Addrs) > 1 && cfg.DB != 0 {
			t.Errorf("ParseURL(%q): a cluster with database %d", raw, cfg.DB)
		}
		if strings.HasPrefix(raw, "redis-sentinel://") != (cfg.MasterSet != "") {
			t.Errorf("ParseURL(%q): master %q", raw, cfg.MasterSet)
		}
	})
}

// password returns the password of a URL, as ParseURL finds it (before its
// last '@'), or "" when its text appears elsewhere in the URL too.
func password(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	at := strings.LastIndexByte(rest, '@')
	if !ok || at < 0 {
		return ""
	}
	_, pass, _ := strings.Cut(rest[:at], ":")
	if strings.Contains(scheme, pass) || strings.Contains(rest[at:], pass) {
		return ""
	}
	return pass
}
