// The decoder of a rule's reservations: the queue limit and the fairness
// quotas of the pools of reservations the rule's limit makes.

package policy

import (
	"fmt"
	"maps"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/reservation"
)

// Reservations configures the pools of reservations of capacity that a
// rule's own limit makes, one per (rule, resource) (see package reserve).
// It is immutable once its Policy is built.
type Reservations struct {
	// QueueLimit is the most requests queued at once in each pool of the
	// rule; zero leaves the server's default.
	QueueLimit int64
	// Quotas are the fairness quotas in configuration order. The decoder
	// refuses two with the same Client and Resource.
	Quotas []Quota
}

// Quota is one fairness quota: what a client is entitled to in the queue
// of a pool (see reservation.Quota).
type Quota struct {
	// Client is the client id the quota is for, or "*" for every client
	// no quota of the pool names.
	Client string
	// Resource is the one resource whose pool the quota is for; "" for
	// every pool of the rule. A quota naming the resource wins over one
	// that does not.
	Resource string
	// Weight, MinGuaranteed and MaxBurst are those of reservation.Quota:
	// Weight 1 to reservation.MaxWeight, zero MaxBurst the pool's
	// capacity.
	Weight, MinGuaranteed, MaxBurst int64

	path string // Resource as rules match it (resourcePath)
}

// PoolQuotas returns the quotas of the pool of resource: the default (of
// client "*"; weight 1 when there is none) and those of the clients
// named, in the form of reservation.Config. named is nil when no client is
// named. rs may be nil: every client then has weight 1.
func (rs *Reservations) PoolQuotas(resource string) (def reservation.Quota, named map[string]reservation.Quota) {
	def = reservation.Quota{Weight: 1}
	if rs == nil {
		return def, nil
	}
	res, _ := resourcePath(resource, false)
	// The quotas of every pool first, then those of this resource over
	// them; the decoder refused two of one client in either.
	for _, own := range [...]bool{false, true} {
		for i := range rs.Quotas {
			q := &rs.Quotas[i]
			if (q.Resource != "") != own || own && q.path != res {
				continue
			}
			rq := reservation.Quota{Weight: q.Weight, MinGuaranteed: q.MinGuaranteed, MaxBurst: q.MaxBurst}
			if q.Client == "*" {
				def = rq
				continue
			}
			if named == nil {
				named = map[string]reservation.Quota{}
			}
			named[q.Client] = rq
		}
	}
	return def, named
}

var (
	reservationKeys = []string{"queue_limit", "quotas"}
	quotaKeys       = []string{"client", "resource", "weight", "min_guaranteed", "max_burst"}
)

// maxQuotaResource bounds a quota's resource, as the reserve API bounds
// the resource of a request.
const maxQuotaResource = 2048

// reservations decodes n, the reservations of rule r, whose own limit has
// been decoded: the quotas are checked against its capacity.
func (d *decoder) reservations(n *yaml.Node, what string, r *Rule) {
	what += ".reservations"
	fs := d.fields(n, what, reservationKeys...)
	if fs == nil {
		return
	}
	if r.Base == nil || r.Base.Spec.DenyAll || r.Base.Spec.Limit < 1 {
		d.errorf(n, "%s: needs the rule's own limit, the pools' capacity (a tiered rule without one has no pool)", what)
		return
	}
	capacity := min(r.Base.Spec.Limit, reservation.MaxCapacity)
	rs := &Reservations{}
	ok := true
	for _, f := range fs {
		switch f.key {
		case "queue_limit":
			v, good := d.int64(f.v, what+".queue_limit")
			if good && (v < 1 || v > reservation.MaxQueueLimit) {
				d.errorf(f.v, "%s.queue_limit: must be between 1 and %d, got %d", what, reservation.MaxQueueLimit, v)
				good = false
			}
			rs.QueueLimit = v
			ok = ok && good
		case "quotas":
			for i, item := range d.seq(f.v, what+".quotas") {
				q, good := d.quota(item, fmt.Sprintf("%s.quotas[%d]", what, i), capacity)
				if good {
					rs.Quotas = append(rs.Quotas, q)
				}
				ok = ok && good
			}
		}
	}
	if ok && d.guarantees(n, what, rs, capacity) {
		r.Reservations = rs
	}
}

// quota decodes one item of quotas.
func (d *decoder) quota(n *yaml.Node, what string, capacity int64) (Quota, bool) {
	q := Quota{Weight: 1}
	ok, burstSet, hasClient := true, false, false
	for _, f := range d.fields(n, what, quotaKeys...) {
		switch f.key {
		case "client", "resource":
			s, good := d.str(f.v, what+"."+f.key)
			switch {
			case !good:
			case s == "" || len(s) > maxQuotaResource:
				d.errorf(f.v, "%s.%s: must be 1 to %d bytes", what, f.key, maxQuotaResource)
				good = false
			case f.key == "client":
				q.Client, hasClient = s, true
			default:
				q.Resource, q.path = s, pathOf(s)
			}
			ok = ok && good
		case "weight", "min_guaranteed", "max_burst":
			v, good := d.int64(f.v, what+"."+f.key)
			lo, hi := int64(0), capacity
			if f.key == "weight" {
				lo, hi = 1, reservation.MaxWeight
			}
			if good && (v < lo || v > hi) {
				d.errorf(f.v, "%s.%s: must be between %d and %d, got %d", what, f.key, lo, hi, v)
				good = false
			}
			switch f.key {
			case "weight":
				q.Weight = v
			case "min_guaranteed":
				q.MinGuaranteed = v
			default:
				q.MaxBurst, burstSet = v, v > 0
			}
			ok = ok && good
		}
	}
	if !hasClient {
		if ok {
			d.errorf(n, "%s: missing client (a client id, or \"*\" for every client not named)", what)
		}
		return q, false
	}
	if ok && burstSet && q.MaxBurst < q.MinGuaranteed {
		d.errorf(n, "%s.max_burst: %d is below min_guaranteed %d", what, q.MaxBurst, q.MinGuaranteed)
		return q, false
	}
	return q, ok
}

// guarantees reports whether no two quotas of rs name the same client and
// resource, and whether the guarantees of the clients named in every pool
// of the rule sum to at most its capacity (reservation.Config.Validate),
// reporting the first problem.
func (d *decoder) guarantees(n *yaml.Node, what string, rs *Reservations, capacity int64) bool {
	type key struct{ client, resource string }
	seen := map[key]bool{}
	resources := map[string]bool{"": true}
	for i := range rs.Quotas {
		q := &rs.Quotas[i]
		k := key{q.Client, q.path}
		if q.Resource == "" {
			k.resource = "\x00" // every pool, unlike a resource that reads as ""
		}
		if seen[k] {
			d.errorf(n, "%s.quotas[%d]: a second quota for client %q and resource %q", what, i, q.Client, q.Resource)
			return false
		}
		seen[k] = true
		if q.Resource != "" {
			resources[q.Resource] = true
		}
	}
	// The pool of a resource no quota names takes those without a
	// resource: the case of resource "".
	for _, res := range slices.Sorted(maps.Keys(resources)) {
		_, named := rs.PoolQuotas(res)
		sum := int64(0)
		for _, q := range named {
			sum += q.MinGuaranteed
		}
		if sum > capacity {
			where := "every pool"
			if res != "" {
				where = fmt.Sprintf("the pool of %q", res)
			}
			d.errorf(n, "%s.quotas: the min_guaranteed of %s sum to %d, above the rule's limit %d", what, where, sum, capacity)
			return false
		}
	}
	return true
}

// pathOf returns resource s as pools compare it: as rules match it.
func pathOf(s string) string {
	p, _ := resourcePath(s, false)
	return p
}
