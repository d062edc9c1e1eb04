package loadgen_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bench/loadgen"
)

// Two servers driven at once on the same keys, 3 to 1: the whole run's
// report sums the regions' and compares what both admitted with the
// limit, as a global limit (here each server has its own store, so both
// admit their limit and the whole run is over it).
func TestRunRegions(t *testing.T) {
	a, b := start(t), start(t)
	rs, err := loadgen.ParseRegions(a.HTTPAddr()+","+b.HTTPAddr(), "3,1")
	if err != nil {
		t.Fatal(err)
	}
	whole, each, err := loadgen.RunRegions(context.Background(), loadgen.Config{Concurrency: 8, Duration: 500 * time.Millisecond,
		Keys: 1, KeyPrefix: "regions", Resource: "/api/burst", ExpectLimit: 20, Window: time.Hour}, rs)
	if err != nil {
		t.Fatal(err)
	}
	if len(each) != 2 || each[0].Concurrency != 6 || each[1].Concurrency != 2 || each[0].Overshoot != nil {
		t.Fatalf("regions: %+v", each)
	}
	if whole.Requests != each[0].Requests+each[1].Requests || whole.Allowed != each[0].Allowed+each[1].Allowed || whole.Concurrency != 8 {
		t.Errorf("whole %d requests, %d allowed; regions %d+%d, %d+%d", whole.Requests, whole.Allowed, each[0].Requests, each[1].Requests, each[0].Allowed, each[1].Allowed)
	}
	if o := whole.Overshoot; o == nil || o.Total != whole.AdmittedCost-20*o.Windows || !strings.Contains(whole.Addr, ",") {
		t.Errorf("whole: admitted %d, overshoot %+v, addr %s", whole.AdmittedCost, o, whole.Addr)
	}
	for _, bad := range [][2]string{{"a:1,,b:2", ""}, {"a:1,b:2", "1"}, {"a:1,b:2", "1,0"}, {"a:1,b:2", "1,x"}} {
		if _, err := loadgen.ParseRegions(bad[0], bad[1]); err == nil {
			t.Errorf("ParseRegions(%q, %q) accepted", bad[0], bad[1])
		}
	}
}
