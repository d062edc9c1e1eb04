package auth

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/control"
)

// fileToken is one entry of a tokens file.
type fileToken struct {
	Name   string `yaml:"name"`
	Role   string `yaml:"role"`
	SHA256 string `yaml:"sha256"`
}

// ParseTokens parses a tokens file: a YAML list of {name, role, sha256},
// sha256 being the token's SHA-256 in hex (`sluice admin token hash`).
// An entry with another field (such as token:), an unknown role, a sha256
// that is not 64 hex digits or a repeated name is refused, the error
// naming the entry.
func ParseTokens(data []byte) ([]control.Token, error) {
	var list []fileToken
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&list); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("tokens file: want a list of {name, role, sha256}: %w", err)
	}
	seen := map[string]bool{}
	out := make([]control.Token, 0, len(list))
	for i, ft := range list {
		t := control.Token{Name: ft.Name, Role: ft.Role, SHA256: ft.SHA256}
		if err := ValidateToken(t); err != nil {
			return nil, fmt.Errorf("tokens file: entry %d (%q): %w", i+1, ft.Name, err)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tokens file: entry %d (%q): name: used by an earlier entry", i+1, ft.Name)
		}
		seen[t.Name] = true
		out = append(out, t)
	}
	return out, nil
}

// LoadTokens reads and parses the tokens file at path (see ParseTokens).
func LoadTokens(path string) ([]control.Token, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	ts, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts, nil
}
