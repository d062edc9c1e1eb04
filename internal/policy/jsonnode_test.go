package policy

import (
	"reflect"
	"testing"
)

// jsonSpecs are rule specs, valid or not, that the JSON reader must read
// as yaml.v3 does.
var jsonSpecs = []string{
	`{"id":"x","limit":1,"window":"1s"}`,
	` { "id" : "x" ,
	  "limit" : 1 , "window" : "1s" } `,
	`{"id":"x","match":{"resource":["/a/*","/b"],"method":"POST","client":["c"]},"dimension":"user+endpoint","algorithm":"gcra","limit":10,"window":"1m","burst":3}`,
	`{"id":"x","tiered":true,"tiers":{"free":{"limit":3}},"shadow":false,"failure_mode":"fail_closed","expected_instances":3}`,
	`{"id":"x","limit":1e99,"window":"-1s"}`,
	`{"id":"x","limit":1.5,"window":"1s"}`,
	`{"id":"x","limit":-0,"window":"1s"}`,
	`{"id":"x","limit":99999999999999999999,"window":"1s"}`,
	`{"id":"x","limit":"10","window":1}`,
	`{"id":"x","limit":null,"window":true}`,
	`{"id":"x","id":"x","limit":1,"window":"1s"}`,
	`{"id":"x","<<":{"limit":1},"window":"1s"}`,
	`{"id":"x","limit":1,"window":"1s","cost_multipliers":{"write":5},"match":{}}`,
	`{"id":"x","limit":1,"window":"1s","match":{"resource":[]}}`,
	`{"id":"x","limit":{},"window":[]}`,
	`{"id":"y","limit":1,"window":"1s"}`,
	`{"id":"","limit":1,"window":"1s"}`,
	`{}`, `[]`, `null`, `{"id":`, `{"id":"x"} {}`, `"x"`,
	`{"id":"x","name":"caf\u00e9","limit":1,"window":"1s"}`,
	`{"id":"x","name":"café","limit":1,"window":"1s"}`,
	`{"id":"x",	"limit":1,"window":"1s"}`,
	`{id: x, limit: 1, window: 1s}`,
	"{\"\x7f\":\"\"}", // JSON takes DEL, YAML does not
	"{\"id\":\"x\",\n\"limit\":1,\r\n\"window\":\"1s\"\n}",
	"{\"id\":\"x\",\"limit\":1,\"window\":\"1s\",\"match\":{\"resource\":\n[\n\"/a\"\n]\n}}",
}

func TestJSONNodeReadsAsYAML(t *testing.T) {
	for _, s := range jsonSpecs {
		checkJSONNode(t, s)
	}
}

func FuzzJSONNode(f *testing.F) {
	for _, s := range jsonSpecs {
		f.Add(s)
	}
	f.Fuzz(checkJSONNode)
}

// checkJSONNode checks that the spec s decodes to the same rule, or the
// same error, with and without the JSON reader.
func checkJSONNode(t *testing.T, s string) {
	p := mustParse(t, layerFile)
	// A slab that a former rule used, as the decoding of a layer reuses
	// it; its limits, which the rule could share, forgotten, as their
	// source names the former rule's fields.
	var sc ruleScratch
	decodeLayerRuleWith(&LayerRule{ID: "x", Spec: []byte(jsonSpecs[2])}, p.st, true, &sc)
	sc.limits = nil
	lr := &LayerRule{ID: "x", Spec: []byte(s)}
	fast, ferr := decodeLayerRuleWith(lr, p.st, true, &sc)
	slow, serr := decodeLayerRuleWith(lr, p.st, false, nil)
	if !reflect.DeepEqual(ferr, serr) {
		t.Fatalf("%s: error %v, want %v", s, ferr, serr)
	}
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("%s: rule %+v, want %+v", s, fast, slow)
	}
}
