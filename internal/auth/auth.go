// Package auth authenticates Sluice's admin API and, when asked, its check
// APIs: bearer tokens kept only as SHA-256 hashes, with roles viewer <
// operator < admin (see control.RoleViewer).
//
// A token is a random secret ("slc_" and 43 base64url characters, see
// Generate); the server keeps its SHA-256 in hex, from a tokens file (see
// ParseTokens) or the control plane (control.Token). A presented token is
// hashed and compared in constant time with every candidate.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/internal/control"
)

// Errors of Authenticate and Authorize.
var (
	// ErrNoToken: the request carries no bearer token (401).
	ErrNoToken = errors.New("sluice: no bearer token")
	// ErrInvalidToken: the token matches none configured (401).
	ErrInvalidToken = errors.New("sluice: invalid token")
	// ErrForbidden: the token's role is below the one required (403).
	ErrForbidden = errors.New("sluice: insufficient role")
)

// TokenPrefix starts every token Generate returns.
const TokenPrefix = "slc_"

// Rank returns the rank of role: 1 viewer, 2 operator, 3 admin, 0 for any
// other string.
func Rank(role string) int {
	switch role {
	case control.RoleViewer:
		return 1
	case control.RoleOperator:
		return 2
	case control.RoleAdmin:
		return 3
	}
	return 0
}

// Allows reports whether a token of role may do what needs role need.
func Allows(role, need string) bool { return Rank(role) > 0 && Rank(role) >= Rank(need) }

// Hash returns the SHA-256 of token in lower-case hex, as the tokens file
// and control.Token keep it.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Generate returns a new random token and its Hash. It fails only when the
// system's random source does.
func Generate() (token, hash string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("auth: generate token: %w", err)
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return token, Hash(token), nil
}

// ValidateToken checks a configured token: a name, a known role and a
// SHA-256 in hex (64 digits), never the token itself. The error names the
// field.
func ValidateToken(t control.Token) error {
	switch {
	case strings.TrimSpace(t.Name) == "":
		return &control.FieldError{Field: "name", Msg: "required"}
	case Rank(t.Role) == 0:
		return &control.FieldError{Field: "role", Msg: fmt.Sprintf("unknown role %q (want viewer, operator or admin)", t.Role)}
	case strings.HasPrefix(t.SHA256, TokenPrefix):
		return &control.FieldError{Field: "sha256", Msg: "this is a token, not its hash: keep only `sluice admin token hash`'s output"}
	}
	if _, err := decodeHash(t.SHA256); err != nil {
		return &control.FieldError{Field: "sha256", Msg: "want the token's SHA-256 as 64 hex digits (`sluice admin token hash`); this looks like a plaintext token"}
	}
	return nil
}

func decodeHash(s string) ([sha256.Size]byte, error) {
	var h [sha256.Size]byte
	if len(s) != 2*sha256.Size {
		return h, errors.New("bad length")
	}
	_, err := hex.Decode(h[:], []byte(s))
	return h, err
}

// TokenSource lists the tokens kept outside the Config, such as the
// control plane's (control.Plane.Tokens). It must be safe for concurrent
// use.
type TokenSource func(ctx context.Context) ([]control.Token, error)

// Authenticator checks bearer tokens against the configured ones. It is
// safe for concurrent use.
type Authenticator struct {
	static []entry
	source TokenSource
}

type entry struct {
	actor control.Actor
	sum   [sha256.Size]byte
}

// New returns an Authenticator of the tokens static (each checked with
// ValidateToken; the error names the entry) and those of source, which may
// be nil.
func New(static []control.Token, source TokenSource) (*Authenticator, error) {
	a := &Authenticator{source: source}
	for i, t := range static {
		if err := ValidateToken(t); err != nil {
			return nil, fmt.Errorf("auth: token %d (%q): %w", i+1, t.Name, err)
		}
		sum, _ := decodeHash(t.SHA256)
		a.static = append(a.static, entry{control.Actor{Name: t.Name, Role: t.Role}, sum})
	}
	return a, nil
}

// Enabled reports whether any token is configured; without one, every
// token is refused. An error of the source counts as none there.
func (a *Authenticator) Enabled(ctx context.Context) bool {
	if len(a.static) > 0 {
		return true
	}
	if a.source == nil {
		return false
	}
	ts, err := a.source(ctx)
	return err == nil && len(ts) > 0
}

// BearerToken returns the token of an Authorization header value
// ("Bearer TOKEN", the scheme in any case), or ErrNoToken.
func BearerToken(header string) (string, error) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", ErrNoToken
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", ErrNoToken
	}
	return tok, nil
}

// Authenticate returns the actor of the Authorization header value header:
// ErrNoToken without a bearer token, ErrInvalidToken when it matches no
// token. The hash of the token is compared with every candidate, in
// constant time, whichever matches. When the source fails and no static
// token matches, the error wraps control.ErrUnavailable.
func (a *Authenticator) Authenticate(ctx context.Context, header string) (control.Actor, error) {
	tok, err := BearerToken(header)
	if err != nil {
		return control.Actor{}, err
	}
	sum := sha256.Sum256([]byte(tok))
	var found control.Actor
	match := 0
	for _, e := range a.static {
		eq := subtle.ConstantTimeCompare(sum[:], e.sum[:])
		if eq == 1 && match == 0 {
			found = e.actor
		}
		match |= eq
	}
	if a.source != nil {
		ts, err := a.source(ctx)
		if err != nil && match == 0 {
			return control.Actor{}, fmt.Errorf("auth: list tokens: %w", err)
		}
		for _, t := range ts {
			h, err := decodeHash(t.SHA256)
			if err != nil {
				continue
			}
			eq := subtle.ConstantTimeCompare(sum[:], h[:])
			if eq == 1 && match == 0 {
				found = control.Actor{Name: t.Name, Role: t.Role}
			}
			match |= eq
		}
	}
	if match == 0 || Rank(found.Role) == 0 {
		return control.Actor{}, ErrInvalidToken
	}
	return found, nil
}

type actorKey struct{}

// WithActor returns ctx carrying the actor a.
func WithActor(ctx context.Context, a control.Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// ActorFrom returns the actor that Require put in ctx.
func ActorFrom(ctx context.Context) (control.Actor, bool) {
	a, ok := ctx.Value(actorKey{}).(control.Actor)
	return a, ok
}
