package picker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestShardByModel: a picker following only model a (--models a, issue
// 21) beside a sidecar of model b: b's summaries are never streamed, its
// endpoint is on /debug/endpoints as not followed, a request for b gets
// 404 model_not_found saying this shard does not serve it, and requests
// for a are routed.
func TestShardByModel(t *testing.T) {
	params := summary.ForCapacity(1024)
	a := simsidecar.Start(t, simsidecar.Config{Index: 0, Params: params, Model: "a"})
	b := simsidecar.Start(t, simsidecar.Config{Index: 1, Params: params, Model: "b"})
	vcfg := fleetview.DefaultConfig()
	vcfg.Params, vcfg.Retry, vcfg.Models = params, 20*time.Millisecond, []string{"a"}
	v, err := fleetview.New(vcfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	v.Watch(a.Addr())
	v.Watch(b.Addr())
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		if len(v.Endpoints()) < 1 || len(v.Refused()) < 1 {
			return fmt.Errorf("endpoints %v, refused %v", v.Endpoints(), v.Refused())
		}
		return nil
	})
	r := simRouter(t, v, prometheus.NewRegistry())
	ctx := context.Background()
	body := func(model string) []byte {
		out, _ := json.Marshal(map[string]any{"model": model, "token_ids": []uint32{1, 2, 3, 4, 5, 6, 7, 8}})
		return out
	}
	p, err := r.Route(ctx, intake.Tokens, body("a"), picker.PickOptions{})
	if err != nil {
		t.Fatalf("model a: %v", err)
	}
	if p.Endpoint != a.Endpoint() {
		t.Errorf("model a routed to %s, want %s", p.Endpoint, a.Endpoint())
	}
	r.Done(p)
	_, err = r.Route(ctx, intake.Tokens, body("b"), picker.PickOptions{})
	var ie *intake.Error
	if !errors.As(err, &ie) || ie.Status != http.StatusNotFound || ie.Code != "model_not_found" ||
		!strings.Contains(ie.Message, "not served by this picker shard") || !strings.Contains(ie.Message, "`b`") {
		t.Fatalf("model b: %v, want 404 model_not_found from this shard", err)
	}
	if b.Watches() != 0 || b.Infos() < 1 {
		t.Errorf("b: %d Info calls, %d summary streams; want no stream", b.Infos(), b.Watches())
	}

	srv := httptest.NewServer(r.AdminHandler(picker.HandlerOptions{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + debugapi.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dbg debugapi.Document
	if err := json.NewDecoder(resp.Body).Decode(&dbg); err != nil {
		t.Fatal(err)
	}
	if len(dbg.Endpoints) != 1 || dbg.Endpoints[0].Endpoint != a.Endpoint() || len(dbg.Refused) != 1 ||
		dbg.Refused[0].Endpoint != b.Endpoint() || dbg.Refused[0].Reason != fleetview.ReasonModelNotFollowed || dbg.Refused[0].Model != "b" {
		t.Errorf("/debug/endpoints: %+v", dbg)
	}
}
