package policy

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/reservation"
)

const reservePolicy = `
version: 1
rules:
  - id: exports
    match: { resource: "/export/*" }
    limit: 100
    window: 1s
    reservations:
      queue_limit: 50
      quotas:
        - { client: batch, weight: 4, min_guaranteed: 10, max_burst: 60 }
        - { client: batch, resource: /export/big, weight: 8 }
        - { client: "*", weight: 2 }
        - { client: "*", resource: /export/big, weight: 1, max_burst: 30 }
        - { client: ui, resource: /export/small, min_guaranteed: 90 }
  - { id: plain, limit: 5, window: 1s }
`

func TestReservationQuotas(t *testing.T) {
	p := mustParse(t, reservePolicy)
	rs := p.Rules[0].Reservations
	if rs == nil || rs.QueueLimit != 50 || len(rs.Quotas) != 5 {
		t.Fatalf("reservations %+v, want queue limit 50 and 5 quotas", rs)
	}
	tests := []struct {
		resource string
		def      reservation.Quota
		named    map[string]reservation.Quota
	}{
		{"/export/any", reservation.Quota{Weight: 2},
			map[string]reservation.Quota{"batch": {Weight: 4, MinGuaranteed: 10, MaxBurst: 60}}},
		{"/export/big", reservation.Quota{Weight: 1, MaxBurst: 30},
			map[string]reservation.Quota{"batch": {Weight: 8}}},
		{"/export//big/", reservation.Quota{Weight: 1, MaxBurst: 30},
			map[string]reservation.Quota{"batch": {Weight: 8}}},
		{"/export/small", reservation.Quota{Weight: 2}, map[string]reservation.Quota{
			"batch": {Weight: 4, MinGuaranteed: 10, MaxBurst: 60}, "ui": {Weight: 1, MinGuaranteed: 90}}},
	}
	for _, tc := range tests {
		def, named := rs.PoolQuotas(tc.resource)
		if def != tc.def || !maps.Equal(named, tc.named) {
			t.Errorf("PoolQuotas(%q) = %+v, %+v; want %+v, %+v", tc.resource, def, named, tc.def, tc.named)
		}
	}
	if p.Rules[1].Reservations != nil {
		t.Errorf("a rule without reservations has %+v", p.Rules[1].Reservations)
	}
	def, named := p.Rules[1].Reservations.PoolQuotas("/x")
	if def != (reservation.Quota{Weight: 1}) || named != nil {
		t.Errorf("PoolQuotas of no reservations = %+v, %+v; want weight 1 and none named", def, named)
	}
}

func TestReservationErrors(t *testing.T) {
	rule := "version: 1\nrules:\n  - id: a\n    limit: 100\n    window: 1s\n    reservations:\n"
	tests := []struct{ name, src, want string }{
		{"unknown key", rule + "      queue: 3\n", `test.yaml:7:7: rule "a".reservations: unknown key "queue"`},
		{"queue limit", rule + "      queue_limit: 0\n", `rule "a".reservations.queue_limit: must be between 1 and 65536, got 0`},
		{"not a list", rule + "      quotas: {client: a}\n", `rule "a".reservations.quotas: want a list`},
		{"unknown quota key", rule + "      quotas: [{client: c, wieght: 2}]\n", `rule "a".reservations.quotas[0]: unknown key "wieght"`},
		{"weight zero", rule + "      quotas: [{client: c, weight: 0}]\n", `test.yaml:7:36: rule "a".reservations.quotas[0].weight: must be between 1 and 65536, got 0`},
		{"weight above", rule + "      quotas: [{client: c, weight: 65537}]\n", `quotas[0].weight: must be between 1 and 65536`},
		{"weight not a number", rule + "      quotas: [{client: c, weight: heavy}]\n", `quotas[0].weight: want an integer, got "heavy"`},
		{"negative guarantee", rule + "      quotas: [{client: c, min_guaranteed: -1}]\n", `quotas[0].min_guaranteed: must be between 0 and 100, got -1`},
		{"burst above the limit", rule + "      quotas: [{client: c, max_burst: 101}]\n", `quotas[0].max_burst: must be between 0 and 100, got 101`},
		{"burst below guarantee", rule + "      quotas: [{client: c, min_guaranteed: 5, max_burst: 4}]\n", `quotas[0].max_burst: 4 is below min_guaranteed 5`},
		{"no client", rule + "      quotas: [{weight: 2}]\n", `quotas[0]: missing client`},
		{"empty client", rule + "      quotas: [{client: \"\"}]\n", `quotas[0].client: must be 1 to 2048 bytes`},
		{"twice", rule + "      quotas: [{client: c}, {client: c, weight: 2}]\n", `rule "a".reservations.quotas[1]: a second quota for client "c"`},
		{"guarantees", rule + "      quotas: [{client: c, min_guaranteed: 60}, {client: d, min_guaranteed: 50}]\n", `the min_guaranteed of every pool sum to 110, above the rule's limit 100`},
		{"guarantees of a resource", rule + "      quotas: [{client: c, min_guaranteed: 60}, {client: d, resource: /r, min_guaranteed: 50}]\n", `the min_guaranteed of the pool of "/r" sum to 110`},
		{"tiered rule", "version: 1\ntiers: {free: {limit: 1, window: 1s}}\nrules:\n  - {id: a, tiered: true, reservations: {queue_limit: 3}}\n", `rule "a".reservations: needs the rule's own limit`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(tt.src))
			if err == nil {
				t.Fatalf("Parse: no error, want %q", tt.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error:\n%v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// TestLayerRuleReservations checks that a rule written through the control
// plane carries reservations as a file's rule does, and that its errors
// name the field.
func TestLayerRuleReservations(t *testing.T) {
	p := mustParse(t, layerFile)
	spec := `{"id":"rsv","match":{"resource":"/r"},"limit":10,"window":"1s",` +
		`"reservations":{"queue_limit":7,"quotas":[{"client":"a","weight":3},{"client":"*","max_burst":5}]}}`
	lp, err := p.WithLayer(&Layer{Rules: []LayerRule{{ID: "rsv", Spec: []byte(spec), Version: 1}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs := lp.Rules[len(lp.Rules)-1].Reservations
	def, named := rs.PoolQuotas("/r")
	if rs.QueueLimit != 7 || def != (reservation.Quota{Weight: 1, MaxBurst: 5}) || named["a"] != (reservation.Quota{Weight: 3}) {
		t.Errorf("layer rule's reservations %+v: default %+v, named %+v", rs, def, named)
	}
	bad := `{"id":"rsv","limit":10,"window":"1s","reservations":{"quotas":[{"client":"a","weight":0}]}}`
	_, err = p.WithLayer(&Layer{Rules: []LayerRule{{ID: "rsv", Spec: []byte(bad), Version: 1}}}, nil)
	var le *LayerError
	if !errors.As(err, &le) || le.Field != "reservations.quotas[0].weight" {
		t.Fatalf("error %v, want a *LayerError naming reservations.quotas[0].weight", err)
	}
}

// checkPools fails t unless every pool of rule r (for each resource its
// quotas name, and resource) has a valid reservation.Config, as the
// Keeper builds it: what the decoder accepts, a pool accepts.
func checkPools(t *testing.T, r *Rule, resource string) {
	t.Helper()
	if r.Reservations == nil {
		return
	}
	resources := []string{resource, ""}
	for _, q := range r.Reservations.Quotas {
		resources = append(resources, q.Resource)
	}
	for _, res := range resources {
		def, named := r.Reservations.PoolQuotas(res)
		c := reservation.Config{Capacity: min(r.Base.Spec.Limit, reservation.MaxCapacity), QueueLimit: 1,
			AgingPeriod: 1, Default: def, Quotas: named}
		if err := c.Validate(); err != nil {
			t.Fatalf("rule %s, pool of %q: %v", r.ID, res, err)
		}
	}
}
