package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/localfleet"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/sidecar/index"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/workload"
)

// TestSameDecisionsAsTheInProcessFleet: the lab and the in-process fleet
// (real simulated engines over HTTP, their KV events through the event
// sink into picker/localfleet, a router rendering over HTTP) make the
// same decisions on the same inputs — the same requests, one at a time,
// to engines of the same URLs — for kvroute's policy and each peer's.
func TestSameDecisionsAsTheInProcessFleet(t *testing.T) {
	sc := convos{n: 8, turns: 3, engines: 3}
	for _, pol := range []score.Policy{score.Precise, score.PrefixHash, score.Dynamo, score.SGLang, score.LLMD, score.LLMDPrecise} {
		t.Run(string(pol), func(t *testing.T) {
			real, urls := realDecisions(t, sc, pol)
			cfg := DefaultConfig()
			cfg.Policy, cfg.Engines, cfg.EngineURLs = pol, len(urls), urls
			outs, err := Run(cfg, sequential{sc}, workload.Options{Seed: 1, Rate: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(outs) != len(real) {
				t.Fatalf("lab: %d requests, in-process: %d", len(outs), len(real))
			}
			for i, o := range outs {
				if o.Endpoint != real[i] {
					t.Errorf("request %d (conversation %d turn %d): lab chose %s, the in-process fleet %s", i, o.Conversation, o.Turn, o.Endpoint, real[i])
				}
			}
		})
	}
}

// sequential runs a scenario's sessions one after another, each a second
// after the one before ended, so nothing is in flight at a decision.
type sequential struct{ convos }

func (s sequential) Plan(o workload.Options) (workload.Plan, error) {
	p, err := s.convos.Plan(o)
	if err != nil {
		return p, err
	}
	for i := range p.Sessions {
		p.Sessions[i].Session = &spaced{s: p.Sessions[i].Session}
		if i > 0 {
			p.Sessions[i].Start, p.Sessions[i].After = 0, &workload.After{Session: i - 1, Turn: 1 << 30}
		}
	}
	return p, nil
}

// spaced waits a second before each request.
type spaced struct{ s workload.Session }

func (s *spaced) Next(prev *workload.Answer) (workload.Request, time.Duration, bool) {
	req, _, done := s.s.Next(prev)
	return req, time.Second, done
}

// realDecisions sends sc's requests, one at a time, through a router over
// the in-process fleet of real engines, and returns the endpoint each
// went to, and the engines' URLs.
func realDecisions(t *testing.T, sc convos, pol score.Policy) ([]string, []string) {
	t.Helper()
	lcfg := localfleet.DefaultConfig()
	lcfg.Params = summary.ForCapacity(index.DefaultCapacity)
	lf, err := localfleet.New(lcfg)
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	var engines []*enginesim.Engine
	for i := 0; i < sc.engines; i++ {
		ecfg, err := engineConfig("", sc.Fleet().GPUBlocks, 0)
		if err != nil {
			t.Fatal(err)
		}
		ecfg.Host, ecfg.Port, ecfg.Sim.TimeScale = "127.0.0.1", 0, 0
		var url atomic.Pointer[string]
		ecfg.EventSink = func(b kvevents.Batch) {
			if err := lf.Update(*url.Load(), &b, time.Now()); err != nil {
				t.Errorf("in-process fleet: %v", err)
			}
		}
		p, err := enginesim.Start(ecfg, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		e := p.Engines()[0]
		u := e.URL()
		url.Store(&u)
		if err := lf.Add(fleet.Identity{Endpoint: u, Model: ecfg.Model, BlockSize: ecfg.BlockSize, NumGPUBlocks: ecfg.NumGPUBlocks,
			HashAlgo: ecfg.HashAlgo, KeyFormat: blockkey.FormatV1, TokenizerFingerprint: "lab"}, time.Now()); err != nil {
			t.Fatal(err)
		}
		urls, engines = append(urls, u), append(engines, e)
	}
	pcfg := picker.DefaultConfig()
	pcfg.Score.Policy, pcfg.AccessLog, pcfg.PolicySeed = pol, 0, 1
	pcfg.Admission.MaxWaiting, pcfg.Admission.MaxKVUsage, pcfg.Admission.MaxPrefillTokens = 0, 0, 0
	rt, err := picker.NewRouter(pcfg, lf, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	plan, err := sequential{sc}.Plan(workload.Options{Seed: 1, Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	var chosen []string
	for _, ps := range plan.Sessions {
		var prev *workload.Answer
		for {
			req, _, done := ps.Session.Next(prev)
			if done {
				break
			}
			for _, e := range engines { // the sidecars' load reports: every engine idle
				l := e.Load()
				lf.SetLoad(e.URL(), fleet.Load{Waiting: float64(l.Waiting), Running: float64(l.Running), KVCacheUsage: l.KVUsage}, time.Now())
			}
			kind, _ := kindOf(req.Path)
			pick, err := rt.Route(context.Background(), kind, req.Body, picker.PickOptions{Carried: true})
			if err != nil {
				t.Fatal(err)
			}
			text := stream(t, pick.Endpoint+req.Path, req.Body)
			now := time.Now()
			rt.FirstChunk(pick, now)
			rt.FirstToken(pick, now)
			rt.Done(pick)
			chosen = append(chosen, pick.Endpoint)
			prev = &workload.Answer{Endpoint: pick.Endpoint, Text: text, OK: true}
		}
	}
	return chosen, urls
}

// stream posts a streaming chat body and returns the answer's text.
func stream(t *testing.T, url string, body []byte) string {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d", url, resp.StatusCode)
	}
	var text bytes.Buffer
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok || string(line) == "[DONE]" {
			continue
		}
		text.WriteString(deltaOf(line))
	}
	return text.String()
}

// deltaOf is a chat chunk's content delta.
func deltaOf(chunk []byte) string {
	var c struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(chunk, &c) != nil || len(c.Choices) == 0 {
		return ""
	}
	return c.Choices[0].Delta.Content
}
