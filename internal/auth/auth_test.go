package auth_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
)

func TestGenerateHash(t *testing.T) {
	tok, sum, err := auth.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, auth.TokenPrefix) || len(sum) != 64 || auth.Hash(tok) != sum {
		t.Fatalf("Generate() = %q, %q; want a prefixed token and its 64-digit hash", tok, sum)
	}
	tok2, _, _ := auth.Generate()
	if tok2 == tok {
		t.Fatal("two Generate() calls returned the same token")
	}
}

func TestParseTokens(t *testing.T) {
	good := auth.Hash("secret")
	for _, tc := range []struct {
		name, yaml, wantErr string
		want                int
	}{
		{"ok", "- {name: ci, role: operator, sha256: " + good + "}\n- {name: root, role: admin, sha256: " + good + "}", "", 2},
		{"empty", "", "", 0},
		{"plaintext", "- {name: ci, role: admin, sha256: hunter2}", `entry 1 ("ci"): sha256`, 0},
		{"token itself", "- {name: ci, role: admin, sha256: slc_abc}", `entry 1 ("ci"): sha256`, 0},
		{"token field", "- {name: ci, role: admin, token: abc}", "field token not found", 0},
		{"unknown role", "- {name: a, role: admin, sha256: " + good + "}\n- {name: b, role: root, sha256: " + good + "}", `entry 2 ("b"): role: unknown role "root"`, 0},
		{"no name", "- {role: admin, sha256: " + good + "}", "entry 1 (\"\"): name", 0},
		{"repeated", "- {name: a, role: admin, sha256: " + good + "}\n- {name: a, role: viewer, sha256: " + good + "}", `entry 2 ("a"): name`, 0},
		{"not a list", "name: a", "want a list", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := auth.ParseTokens([]byte(tc.yaml))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseTokens error = %v; want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != tc.want {
				t.Fatalf("ParseTokens = %v, %v; want %d tokens", got, err, tc.want)
			}
		})
	}
}

func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	source := func(context.Context) ([]control.Token, error) {
		return []control.Token{{Name: "stored", Role: control.RoleViewer, SHA256: auth.Hash("stored-secret")}}, nil
	}
	a, err := auth.New([]control.Token{{Name: "ops", Role: control.RoleOperator, SHA256: auth.Hash("ops-secret")}}, source)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		header, wantName string
		wantErr          error
	}{
		{"Bearer ops-secret", "ops", nil},
		{"bearer   ops-secret ", "ops", nil},
		{"Bearer stored-secret", "stored", nil},
		{"", "", auth.ErrNoToken},
		{"Basic b3BzOnNlY3JldA==", "", auth.ErrNoToken},
		{"Bearer ", "", auth.ErrNoToken},
		{"Bearer wrong", "", auth.ErrInvalidToken},
		{"Bearer " + auth.Hash("ops-secret"), "", auth.ErrInvalidToken},
	} {
		got, err := a.Authenticate(ctx, tc.header)
		if !errors.Is(err, tc.wantErr) || got.Name != tc.wantName {
			t.Errorf("Authenticate(%q) = %v, %v; want %q, %v", tc.header, got, err, tc.wantName, tc.wantErr)
		}
	}
	// A failing source: static tokens still work, others get unavailable.
	down, _ := auth.New([]control.Token{{Name: "ops", Role: control.RoleOperator, SHA256: auth.Hash("ops-secret")}},
		func(context.Context) ([]control.Token, error) { return nil, control.ErrUnavailable })
	if _, err := down.Authenticate(ctx, "Bearer ops-secret"); err != nil {
		t.Errorf("static token with the source down: %v", err)
	}
	if _, err := down.Authenticate(ctx, "Bearer other"); !errors.Is(err, control.ErrUnavailable) {
		t.Errorf("unknown token with the source down: %v; want ErrUnavailable", err)
	}
}

func TestRequire(t *testing.T) {
	a, err := auth.New([]control.Token{
		{Name: "v", Role: control.RoleViewer, SHA256: auth.Hash("v")},
		{Name: "o", Role: control.RoleOperator, SHA256: auth.Hash("o")},
		{Name: "a", Role: control.RoleAdmin, SHA256: auth.Hash("a")},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		act, _ := auth.ActorFrom(r.Context())
		w.Write([]byte(act.Name))
	})
	h := a.Require(control.RoleOperator, next)
	for _, tc := range []struct {
		token      string
		wantStatus int
		wantAuth   string
	}{
		{"", 401, `Bearer realm="sluice"`},
		{"bad", 401, `Bearer realm="sluice", error="invalid_token"`},
		{"v", 403, `Bearer realm="sluice", error="insufficient_scope"`},
		{"o", 200, ""},
		{"a", 200, ""},
	} {
		req := httptest.NewRequest("GET", "/x", nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.wantStatus || rec.Header().Get("WWW-Authenticate") != tc.wantAuth {
			t.Errorf("token %q: %d %q; want %d %q", tc.token, rec.Code, rec.Header().Get("WWW-Authenticate"), tc.wantStatus, tc.wantAuth)
		}
		if tc.wantStatus != 200 && !strings.Contains(rec.Body.String(), `"error_description"`) {
			t.Errorf("token %q: body %s; want a JSON error", tc.token, rec.Body)
		}
		if tc.wantStatus == 200 && rec.Body.String() != tc.token {
			t.Errorf("token %q: actor %q", tc.token, rec.Body)
		}
	}
}

func TestGRPCInterceptors(t *testing.T) {
	a, _ := auth.New([]control.Token{{Name: "c", Role: control.RoleViewer, SHA256: auth.Hash("check-secret")}}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(a.UnaryInterceptor()), grpc.StreamInterceptor(a.StreamInterceptor()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, tc := range []struct {
		md   string
		want codes.Code
	}{{"", codes.Unauthenticated}, {"Bearer nope", codes.Unauthenticated}, {"Bearer check-secret", codes.OK}} {
		ctx := context.Background()
		if tc.md != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tc.md)
		}
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) != tc.want {
			t.Errorf("unary with %q: %v; want %v", tc.md, err, tc.want)
		}
		st, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != tc.want {
			t.Errorf("stream with %q: %v; want %v", tc.md, err, tc.want)
		}
	}
}
