package redis

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// ParseURL returns the Config of a store URL:
//
//	redis://[user:password@]host:port[/db]       a standalone server
//	rediss://[user:password@]host:port[/db]      the same over TLS
//	redis-cluster://[user:password@]host:port,host:port,...
//	                                              seeds of a Redis Cluster
//	rediss-cluster://...                          the same over TLS
//	redis-sentinel://[user:password@]host:port,host:port,.../master[/db]
//	                                              the master named master,
//	                                              found by its Sentinels
//
// The port defaults to 6379, and to 26379 for a Sentinel; an IPv6 address
// goes in brackets, with or without a port ([::1], [::1]:6380). A cluster
// has no database number. The user name and password of a Sentinel URL
// authenticate to the master, not to the Sentinels. Its errors name what
// is wrong and never contain the password.
func ParseURL(raw string) (Config, error) {
	var cfg Config
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return cfg, fmt.Errorf("redis: URL: missing scheme (want %s)", schemes)
	}
	cluster, sentinel := false, false
	defaultPort := "6379"
	switch scheme {
	case "redis":
	case "rediss":
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	case "redis-cluster":
		cluster = true
	case "rediss-cluster":
		cluster = true
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	case "redis-sentinel":
		sentinel, defaultPort = true, "26379"
	default:
		return cfg, fmt.Errorf("redis: URL: unknown scheme %q (want %s)", scheme, schemes)
	}
	// The user information ends at the last '@' of the URL, wherever the
	// other delimiters are: text before it may be the password, and is
	// never quoted by an error.
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user := rest[:at]
		rest = rest[at+1:]
		if strings.ContainsAny(user, "/?#") {
			return cfg, fmt.Errorf("redis: URL: the user name or password holds a '/', '?' or '#'; percent-escape it (%%2F, %%3F, %%23)")
		}
		name, pass, hasPass := strings.Cut(user, ":")
		var err error
		if cfg.Username, err = url.PathUnescape(name); err != nil {
			return cfg, fmt.Errorf("redis: URL: user name: %w", err)
		}
		if hasPass {
			if cfg.Password, err = url.PathUnescape(pass); err != nil {
				return cfg, fmt.Errorf("redis: URL: password is not well escaped")
			}
		}
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		return cfg, fmt.Errorf("redis: URL: query parameters are not supported")
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if hosts == "" {
		return cfg, fmt.Errorf("redis: URL: no host")
	}
	for _, h := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = h, defaultPort
			if len(h) >= 2 && h[0] == '[' && h[len(h)-1] == ']' {
				host = h[1 : len(h)-1] // an IPv6 address without a port
			}
		}
		if host == "" {
			return cfg, fmt.Errorf("redis: URL: empty host in %q", h)
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return cfg, fmt.Errorf("redis: URL: bad port %q", port)
		}
		cfg.Addrs = append(cfg.Addrs, net.JoinHostPort(host, port))
	}
	if !cluster && !sentinel && len(cfg.Addrs) > 1 {
		return cfg, fmt.Errorf("redis: URL: several hosts need redis-cluster:// or redis-sentinel://")
	}
	if sentinel {
		name, db, hasDB := strings.Cut(path, "/")
		if name == "" {
			return cfg, fmt.Errorf("redis: URL: a Sentinel URL names its master after the hosts: redis-sentinel://host:26379/mymaster")
		}
		cfg.MasterSet = name
		if !hasDB {
			return cfg, nil
		}
		if db == "" {
			return cfg, fmt.Errorf("redis: URL: database: want a number after /%s/", name)
		}
		path = db
	}
	if path != "" {
		if cluster {
			return cfg, fmt.Errorf("redis: URL: a cluster has no database number, got /%s", path)
		}
		db, err := strconv.Atoi(path)
		if err != nil || db < 0 {
			return cfg, fmt.Errorf("redis: URL: database: want a number, got %q", path)
		}
		cfg.DB = db
	}
	return cfg, nil
}

// schemes lists the schemes ParseURL reads, for its errors.
const schemes = "redis://, rediss://, redis-cluster://, rediss-cluster:// or redis-sentinel://"
