package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/alecthomas/kong"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// descriptors is the value of check's repeated --descriptor flag: each
// one key=value[,key=value...], one Envoy descriptor of those entries.
type descriptors []*ratelimitv3.RateLimitDescriptor

func (d *descriptors) String() string {
	if d == nil {
		return ""
	}
	var parts []string
	for _, desc := range *d {
		var kv []string
		for _, e := range desc.Entries {
			kv = append(kv, e.Key+"="+e.Value)
		}
		parts = append(parts, strings.Join(kv, ","))
	}
	return strings.Join(parts, " ")
}

func (d *descriptors) Set(s string) error {
	desc := &ratelimitv3.RateLimitDescriptor{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return &valueError{fmt.Sprintf("%q: want key=value[,key=value...], such as client_id=alice,path=/orders", s)}
		}
		desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	*d = append(*d, desc)
	return nil
}

// Decode reads the value of one --descriptor, for kong.
func (d *descriptors) Decode(ctx *kong.DecodeContext) error {
	var s string
	if err := ctx.Scan.PopValueInto("descriptor", &s); err != nil {
		return err
	}
	return d.Set(s)
}

// envoy sends one ShouldRateLimit of the domain and descriptors of c, with
// its cost as hits_addend, to the gRPC address, with the token as its
// "authorization" when there is one, and prints the answer; it returns
// check's exit code.
func (c *checkCmd) envoy(inv *invocation) int {
	stdout, stderr := inv.stdout, inv.stderr
	domain, descs, hits, token := c.Domain, c.Descriptors, c.Cost, c.Token
	if domain == "" || len(descs) == 0 {
		fmt.Fprintln(stderr, "sluice check: --target envoy needs --domain and at least one --descriptor key=value[,key=value...]")
		return 2
	}
	if hits < 0 || hits > math.MaxUint32 {
		fmt.Fprintf(stderr, "sluice check: --cost %d: want 0 to %d for Envoy's hits_addend\n", hits, uint32(math.MaxUint32))
		return 2
	}
	creds := insecure.NewCredentials()
	if c.TLSOn || c.TLS.any() {
		tc, err := c.TLS.config()
		if err != nil {
			fmt.Fprintf(stderr, "sluice check: %v\n", err)
			return 2
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(c.GRPCAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(stderr, "sluice check: --grpc-addr %q: %v\n", c.GRPCAddr, err)
		return 2
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: domain, Descriptors: descs, HitsAddend: uint32(hits),
	})
	if err != nil {
		fmt.Fprintf(stderr, "sluice check: %v\n", err)
		if st, ok := status.FromError(err); ok && st.Code() == codes.InvalidArgument {
			return 2
		}
		return 3
	}
	if c.JSON {
		// protojson varies its spacing from build to build on purpose:
		// indented again, the output is the same every time.
		data, err := protojson.Marshal(resp)
		var out bytes.Buffer
		if err == nil {
			err = json.Indent(&out, data, "", "  ")
		}
		if err != nil {
			fmt.Fprintf(stderr, "sluice check: %v\n", err)
			return 3
		}
		fmt.Fprintln(stdout, out.String())
	} else {
		printEnvoy(stdout, descs, resp)
	}
	switch resp.OverallCode {
	case rlsv3.RateLimitResponse_OK:
		return 0
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return 1
	}
	fmt.Fprintln(stderr, "sluice check:", errors.New("the server answered UNKNOWN"))
	return 3
}

// printEnvoy prints the verdict of resp and a line per descriptor.
func printEnvoy(w io.Writer, descs descriptors, resp *rlsv3.RateLimitResponse) {
	verdict := "allowed"
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		verdict = "denied"
	}
	fmt.Fprintf(w, "%s (%s)\n", verdict, resp.OverallCode)
	for i, s := range resp.Statuses {
		name := fmt.Sprint(i)
		if i < len(descs) {
			name = (&descriptors{descs[i]}).String()
		}
		fmt.Fprintf(w, "  %s: %s", name, s.Code)
		if l := s.CurrentLimit; l != nil {
			fmt.Fprintf(w, ", limit %d per %s", l.RequestsPerUnit, strings.ToLower(l.Unit.String()))
			if l.Name != "" {
				fmt.Fprintf(w, " (%s)", l.Name)
			}
			fmt.Fprintf(w, ", remaining %d", s.LimitRemaining)
		} else {
			fmt.Fprint(w, ", no limit")
		}
		if d := s.DurationUntilReset; d != nil {
			fmt.Fprintf(w, ", resets in %s", d.AsDuration())
		}
		fmt.Fprintln(w)
	}
}
