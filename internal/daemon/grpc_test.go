package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/daemon"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestGRPCRateLimiter(t *testing.T) {
	td := start(t, policyText())
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	req := &sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited"}
	for i := range 3 {
		resp, err := c.CheckRateLimit(ctx(t), req)
		if err != nil || !resp.GetAllowed() || resp.GetRemaining() != int64(2-i) || resp.GetRule() != "per-client" {
			t.Fatalf("check %d: %v %v", i, resp, err)
		}
	}
	resp, err := c.CheckRateLimit(ctx(t), req)
	if err != nil || resp.GetAllowed() || resp.GetRetryAfter() != 60 || resp.GetState() != sluicev1.State_STATE_THROTTLED || resp.GetResetAt() != epoch.Add(time.Minute).Unix() {
		t.Fatalf("4th check: %v %v, want denied with retry_after 60", resp, err)
	}

	q, err := c.GetRemainingQuota(ctx(t), &sluicev1.QuotaRequest{ClientId: "g1", Resource: "/api/limited"})
	if err != nil || len(q.GetRules()) != 1 || q.GetRules()[0].GetRemaining() != 0 || q.GetRules()[0].GetLimit() != 3 {
		t.Fatalf("quota: %v %v", q, err)
	}
	// ResetLimit is an operator's tool: without a control plane, there
	// are no roles and no ResetLimit.
	if _, err := c.ResetLimit(ctx(t), &sluicev1.ResetRequest{ClientId: "g1", Resource: "/api/limited"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("ResetLimit without a control plane: %v, want PermissionDenied", err)
	}

	b, err := c.BatchCheck(ctx(t), &sluicev1.BatchCheckRequest{
		ClientId: "g1", Mode: sluicev1.BatchMode_BATCH_MODE_BEST_EFFORT,
		Checks: []*sluicev1.CheckRequest{{Resource: "/batch/b"}, {Resource: "/batch/b"}},
	})
	if err != nil || !b.GetPartial() || !b.GetResults()[0].GetAllowed() || b.GetResults()[1].GetAllowed() {
		t.Fatalf("best-effort batch: %v %v", b, err)
	}
	b, err = c.BatchCheck(ctx(t), &sluicev1.BatchCheckRequest{
		ClientId: "g2", Checks: []*sluicev1.CheckRequest{{Resource: "/batch/a"}, {Resource: "/batch/b"}, {Resource: "/batch/b"}},
	})
	if err != nil || b.GetAllowed() {
		t.Fatalf("all-or-nothing batch: %v %v, want refused", b, err)
	}
	q, _ = c.GetRemainingQuota(ctx(t), &sluicev1.QuotaRequest{ClientId: "g2", Resource: "/batch/a"})
	if q.GetRules()[0].GetRemaining() != 2 {
		t.Errorf("batch-a after a refused batch: %v, want 2 remaining", q)
	}

	bad := []*sluicev1.CheckRequest{
		{Resource: "/api/limited"},
		{ClientId: "g1", Cost: ptr(int64(-1))},
		{ClientId: "g1", Priority: sluicev1.Priority(42)},
		// Invalid UTF-8 cannot be sent: the protobuf runtime refuses to
		// marshal it into a proto3 string. The HTTP API tests cover it.
	}
	for _, r := range bad {
		if _, err := c.CheckRateLimit(ctx(t), r); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", r, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestGRPCReflectionOffByDefault checks that server reflection is not
// served unless asked for.
func TestGRPCReflectionOffByDefault(t *testing.T) {
	td := start(t, "")
	stream, err := reflectionpb.NewServerReflectionClient(dial(t, td.GRPCAddr())).ServerReflectionInfo(ctx(t))
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection by default: %v, want Unimplemented", err)
	}
}

func TestGRPCHealthAndReflection(t *testing.T) {
	td := start(t, "", func(c *daemon.Config) { c.GRPCReflection = true })
	conn := dial(t, td.GRPCAddr())
	h, err := healthpb.NewHealthClient(conn).Check(ctx(t), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, s := range resp.GetListServicesResponse().GetService() {
		got[s.GetName()] = true
	}
	for _, want := range []string{"sluice.v1.RateLimiter", "envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !got[want] {
			t.Errorf("reflection lists %v, missing %s", got, want)
		}
	}
}

func envoyReq(domain string, hits uint32, descs ...[]string) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, d := range descs {
		rd := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(d); i += 2 {
			rd.Entries = append(rd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: d[i], Value: d[i+1]})
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}

func TestEnvoyRateLimitService(t *testing.T) {
	td := start(t, "", func(c *daemon.Config) { c.ConfigPath = "testdata/envoy-ratelimit.yaml" })
	c := rlsv3.NewRateLimitServiceClient(dial(t, td.GRPCAddr()))

	// database=default: 5 per minute; hits_addend 2 charges 2.
	resp, err := c.ShouldRateLimit(ctx(t), envoyReq("mongo_cps", 2, []string{"database", "default"}))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 3 ||
		st.GetCurrentLimit().GetRequestsPerUnit() != 5 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE ||
		st.GetDurationUntilReset().AsDuration() != time.Minute {
		t.Errorf("first call: %v", resp)
	}
	resp, err = c.ShouldRateLimit(ctx(t), envoyReq("mongo_cps", 4, []string{"database", "default"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("over the limit: %v %v", resp, err)
	}

	// Several descriptors: nested, unlimited, unknown, deny-all.
	resp, err = c.ShouldRateLimit(ctx(t), envoyReq("mongo_cps", 0,
		[]string{"message_type", "marketing", "to_number", "555"},
		[]string{"ldap", "x"},
		[]string{"unknown", "y"},
		[]string{"remote_address", "50.0.0.5"},
	))
	if err != nil || len(resp.GetStatuses()) != 4 {
		t.Fatalf("several descriptors: %v %v", resp, err)
	}
	sts := resp.GetStatuses()
	// The deny-all descriptor puts the request over the limit, so the
	// others are not charged: the nested one still has all 3.
	if sts[0].GetCode() != rlsv3.RateLimitResponse_OK || sts[0].GetLimitRemaining() != 3 || sts[0].GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
		t.Errorf("nested descriptor: %v", sts[0])
	}
	if sts[1].GetCode() != rlsv3.RateLimitResponse_OK || sts[1].GetCurrentLimit() != nil || sts[1].GetLimitRemaining() != 1<<32-1 {
		t.Errorf("unlimited descriptor: %v", sts[1])
	}
	if sts[2].GetCode() != rlsv3.RateLimitResponse_OK || sts[2].GetCurrentLimit() != nil || sts[2].GetLimitRemaining() != 0 {
		t.Errorf("unknown descriptor: %v", sts[2])
	}
	if sts[3].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("deny-all descriptor: %v, overall %v", sts[3], resp.GetOverallCode())
	}

	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"empty domain":   envoyReq("", 1, []string{"database", "users"}),
		"no descriptors": envoyReq("mongo_cps", 1),
		"empty key":      envoyReq("mongo_cps", 1, []string{"", "users"}),
		"no entries":     {Domain: "mongo_cps", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}},
	} {
		if _, err := c.ShouldRateLimit(ctx(t), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

// rawCodec sends and receives already-encoded messages, so that a test can
// send what generated clients refuse to marshal, such as invalid UTF-8 in
// a string field.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

func TestGRPCBadInputChangesNothing(t *testing.T) {
	td := start(t, policyText())
	conn := dial(t, td.GRPCAddr())
	c := sluicev1.NewRateLimiterClient(conn)
	// One check: per-client has 2 of 3 left, and must keep them.
	if resp, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited"}); err != nil || resp.GetRemaining() != 2 {
		t.Fatalf("first check: %v %v", resp, err)
	}
	long := strings.Repeat("x", 257)
	type call struct {
		name, field string
		do          func() error
	}
	check := func(r *sluicev1.CheckRequest) func() error {
		return func() error { _, err := c.CheckRateLimit(ctx(t), r); return err }
	}
	batch := func(r *sluicev1.BatchCheckRequest) func() error {
		return func() error { _, err := c.BatchCheck(ctx(t), r); return err }
	}
	lim := func(cost int64) *sluicev1.CheckRequest {
		return &sluicev1.CheckRequest{Resource: "/api/limited", Cost: ptr(cost)}
	}
	many := make([]*sluicev1.CheckRequest, 1001)
	for i := range many {
		many[i] = lim(1)
	}
	for _, tt := range []call{
		{"missing client_id", "client_id", check(&sluicev1.CheckRequest{Resource: "/api/limited"})},
		{"negative cost", "cost", check(&sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited", Cost: ptr(int64(-1))})},
		{"huge cost", "cost", check(&sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited", Cost: ptr(int64(1<<30 + 1))})},
		{"unknown priority", "priority", check(&sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited", Priority: sluicev1.Priority(42)})},
		{"long client_id", "client_id", check(&sluicev1.CheckRequest{ClientId: long, Resource: "/api/limited"})},
		{"long user", "user", check(&sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited", User: long})},
		{"long idempotency_key", "idempotency_key", check(&sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited", IdempotencyKey: long})},
		{"long resource", "resource", check(&sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited" + strings.Repeat("/x", 1100)})},
		{"control character", "ip", check(&sluicev1.CheckRequest{ClientId: "g1", Resource: "/api/limited", Ip: "1.2.3.4\n"})},
		{"batch: unknown mode", "mode", batch(&sluicev1.BatchCheckRequest{ClientId: "g1", Mode: sluicev1.BatchMode(9), Checks: []*sluicev1.CheckRequest{lim(1)}})},
		{"batch: unknown priority", "priority", batch(&sluicev1.BatchCheckRequest{ClientId: "g1", Priority: sluicev1.Priority(7), Checks: []*sluicev1.CheckRequest{lim(1)}})},
		{"batch: no checks", "checks", batch(&sluicev1.BatchCheckRequest{ClientId: "g1"})},
		{"batch: too many checks", "checks", batch(&sluicev1.BatchCheckRequest{ClientId: "g1", Checks: many})},
		{"batch: bad second check", "checks[1].cost", batch(&sluicev1.BatchCheckRequest{ClientId: "g1", Mode: sluicev1.BatchMode_BATCH_MODE_BEST_EFFORT, Checks: []*sluicev1.CheckRequest{lim(1), lim(-1)}})},
		{"batch: no client", "checks[0].client_id", batch(&sluicev1.BatchCheckRequest{Checks: []*sluicev1.CheckRequest{lim(1)}})},
		{"batch: its own long user", "user", batch(&sluicev1.BatchCheckRequest{ClientId: "g1", User: long,
			Checks: []*sluicev1.CheckRequest{{ClientId: "g1", Resource: "/api/limited", User: "u"}}})},
		{"batch: its own client_id with a control character", "client_id", batch(&sluicev1.BatchCheckRequest{ClientId: "g\x01",
			Checks: []*sluicev1.CheckRequest{{ClientId: "g1", Resource: "/api/limited"}}})},
		{"quota: missing client_id", "client_id", func() error {
			_, err := c.GetRemainingQuota(ctx(t), &sluicev1.QuotaRequest{Resource: "/api/limited"})
			return err
		}},
		{"reset: long ip", "ip", func() error {
			_, err := c.ResetLimit(ctx(t), &sluicev1.ResetRequest{ClientId: "g1", Resource: "/api/limited", Ip: long})
			return err
		}},
	} {
		err := tt.do()
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), tt.field+":") {
			t.Errorf("%s: %v, want InvalidArgument naming %s", tt.name, err, tt.field)
		}
	}

	// Invalid UTF-8, sent as raw bytes (generated Go clients refuse to
	// marshal it, other clients can send it): InvalidArgument naming the
	// field, not grpc-go's Internal.
	str := func(b []byte, num protowire.Number, v string) []byte {
		return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
	}
	msg := func(b []byte, num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
	}
	good := str(nil, 2, "/api/limited")
	for _, tt := range []struct {
		method, field string
		raw           []byte
	}{
		{"CheckRateLimit", "client_id", str(str(nil, 1, "g\xff1"), 2, "/api/limited")},
		{"CheckRateLimit", "user", str(str(good, 1, "g1"), 7, "\xc3")},
		{"BatchCheck", "checks[1].user", msg(msg(str(nil, 1, "g1"), 7, good), 7, str(good, 7, "u\xfe"))},
		{"GetRemainingQuota", "resource", str(str(nil, 1, "g1"), 2, "/api/\xff")},
	} {
		var out []byte
		err := conn.Invoke(ctx(t), "/sluice.v1.RateLimiter/"+tt.method, &tt.raw, &out, grpc.ForceCodec(rawCodec{}))
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), tt.field+": invalid UTF-8") {
			t.Errorf("%s with invalid UTF-8 in %s: %v, want InvalidArgument naming it", tt.method, tt.field, err)
		}
	}

	q, err := c.GetRemainingQuota(ctx(t), &sluicev1.QuotaRequest{ClientId: "g1", Resource: "/api/limited"})
	if err != nil || len(q.GetRules()) != 1 || q.GetRules()[0].GetRemaining() != 2 {
		t.Errorf("quota after bad input: %v %v, want 2 remaining", q, err)
	}
}

func TestEnvoyBadInputChangesNothing(t *testing.T) {
	td := start(t, "", func(c *daemon.Config) { c.ConfigPath = "testdata/envoy-ratelimit.yaml" })
	c := rlsv3.NewRateLimitServiceClient(dial(t, td.GRPCAddr()))
	good := envoyReq("mongo_cps", 1, []string{"database", "default"})
	remaining := func() uint32 {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx(t), good)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatuses()[0].GetLimitRemaining()
	}
	if got := remaining(); got != 4 {
		t.Fatalf("first call: %d remaining, want 4", got)
	}
	withDesc := func(mod func(*rlsv3.RateLimitRequest)) *rlsv3.RateLimitRequest {
		r := envoyReq("mongo_cps", 1, []string{"database", "default"})
		mod(r)
		return r
	}
	manyEntries := make([]string, 0, 66)
	for range 33 {
		manyEntries = append(manyEntries, "database", "default")
	}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"huge hits_addend": envoyReq("mongo_cps", 1_000_000_001, []string{"database", "default"}),
		"huge descriptor hits_addend": withDesc(func(r *rlsv3.RateLimitRequest) {
			r.Descriptors[0].HitsAddend = wrapperspb.UInt64(1 << 40)
		}),
		"negative hits": withDesc(func(r *rlsv3.RateLimitRequest) { r.Descriptors[0].IsNegativeHits = true }),
		"too many descriptors": withDesc(func(r *rlsv3.RateLimitRequest) {
			for range 64 {
				r.Descriptors = append(r.Descriptors, r.Descriptors[0])
			}
		}),
		"too many entries": envoyReq("mongo_cps", 1, manyEntries),
		"long value":       envoyReq("mongo_cps", 1, []string{"database", "default"}, []string{"database", strings.Repeat("v", 64<<10+1)}),
		"long domain":      envoyReq(strings.Repeat("d", 513), 1, []string{"database", "default"}),
	} {
		if _, err := c.ShouldRateLimit(ctx(t), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	// Invalid UTF-8 in a descriptor value, sent as raw bytes.
	var entry, desc, raw, out []byte
	entry = protowire.AppendString(protowire.AppendTag(entry, 1, protowire.BytesType), "database")
	entry = protowire.AppendString(protowire.AppendTag(entry, 2, protowire.BytesType), "def\xffault")
	desc = protowire.AppendBytes(protowire.AppendTag(desc, 1, protowire.BytesType), entry)
	raw = protowire.AppendString(protowire.AppendTag(raw, 1, protowire.BytesType), "mongo_cps")
	raw = protowire.AppendBytes(protowire.AppendTag(raw, 2, protowire.BytesType), desc)
	err := dial(t, td.GRPCAddr()).Invoke(ctx(t), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &raw, &out, grpc.ForceCodec(rawCodec{}))
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "descriptors[0].entries[0].value: invalid UTF-8") {
		t.Errorf("invalid UTF-8 in a descriptor value: %v, want InvalidArgument naming it", err)
	}
	if got := remaining(); got != 3 {
		t.Errorf("after bad input: %d remaining, want 3 (only the good calls counted)", got)
	}
}

// TestMalformedProtobufInvalidArgument checks that a request that is not
// well-formed protobuf gets InvalidArgument on Sluice's and Envoy's gRPC
// APIs, not grpc-go's Internal, and changes nothing.
func TestMalformedProtobufInvalidArgument(t *testing.T) {
	td := start(t, "", func(c *daemon.Config) { c.ConfigPath = "testdata/envoy-ratelimit.yaml" })
	conn := dial(t, td.GRPCAddr())
	truncated := []byte{0x0a, 0x05, 'a'} // field 1 claims 5 bytes, has 1
	badTag := []byte{0x00, 0x01}         // field number 0
	for _, method := range []string{
		"/sluice.v1.RateLimiter/CheckRateLimit",
		"/sluice.v1.RateLimiter/BatchCheck",
		"/sluice.v1.RateLimiter/GetRemainingQuota",
		"/sluice.v1.RateLimiter/ResetLimit",
		"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
	} {
		for _, raw := range [][]byte{truncated, badTag} {
			var out []byte
			err := conn.Invoke(ctx(t), method, &raw, &out, grpc.ForceCodec(rawCodec{}))
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "malformed request") {
				t.Errorf("%s with %x: %v, want InvalidArgument (malformed request)", method, raw, err)
			}
		}
	}
}

// ResetLimit needs a token of role operator or admin.
func TestGRPCResetNeedsOperator(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("- {name: ops, role: operator, sha256: "+auth.Hash("op-token")+"}\n- {name: eyes, role: viewer, sha256: "+auth.Hash("view-token")+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	td := start(t, policyText(), func(c *daemon.Config) { c.DataDir, c.AdminTokensPath = filepath.Join(dir, "data"), tokens })
	c := sluicev1.NewRateLimiterClient(dial(t, td.GRPCAddr()))
	with := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+token)
	}
	req := &sluicev1.CheckRequest{ClientId: "r1", Resource: "/api/limited"}
	for range 3 {
		if _, err := c.CheckRateLimit(ctx(t), req); err != nil {
			t.Fatal(err)
		}
	}
	reset := &sluicev1.ResetRequest{ClientId: "r1", Resource: "/api/limited"}
	for _, tc := range []struct {
		ctx  context.Context
		want codes.Code
	}{
		{ctx(t), codes.Unauthenticated},
		{with("wrong"), codes.Unauthenticated},
		{with("view-token"), codes.PermissionDenied},
		{with("op-token"), codes.OK},
	} {
		if _, err := c.ResetLimit(tc.ctx, reset); status.Code(err) != tc.want {
			t.Errorf("ResetLimit: %v, want %s", err, tc.want)
		}
	}
	q, err := c.GetRemainingQuota(ctx(t), &sluicev1.QuotaRequest{ClientId: "r1", Resource: "/api/limited"})
	if err != nil || q.GetRules()[0].GetRemaining() != 3 {
		t.Fatalf("quota after the operator's reset: %v %v, want 3 remaining", q, err)
	}
}
