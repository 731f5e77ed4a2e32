package enginesim_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/test/enginesim"
)

// BenchmarkShortRequests measures one engine at time scale 0 serving short
// completions (a ~50-token prompt, one output token) from 32 concurrent
// keep-alive clients, with KV events on. Target: ≥ 2,000 requests/s on
// the 2-core machine, load generator included.
func BenchmarkShortRequests(b *testing.B) {
	cfg := testConfig()
	withEvents(&cfg, "tcp://127.0.0.1:*")
	p, err := enginesim.Start(cfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	url := p.Engines()[0].URL() + "/v1/completions"
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	const clients = 32
	var next atomic.Int64
	var failed atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				body := fmt.Sprintf(`{"prompt":"request %d asks a short question about the shared system prompt and the cache","max_tokens":1}`, i%512)
				resp, err := hc.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d requests failed", f)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
}

// BenchmarkMemory64kBlocks fills an engine with 65,536 cached blocks (128
// distinct 8,192-token prompts of 16-token blocks) and reports the live
// heap after a GC, and the process's resident memory (engine, test client
// and runtime together). Target: ≤ 50 MB.
func BenchmarkMemory64kBlocks(b *testing.B) {
	for i := 0; i < b.N; i++ {
		cfg := testConfig()
		cfg.NumGPUBlocks = 65536 + 513 // room for every prompt plus the null block
		cfg.MaxModelLen = 8193
		withEvents(&cfg, "tcp://127.0.0.1:*")
		p, err := enginesim.Start(cfg, zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		e := p.Engines()[0]
		prompt := make([]int, 8192)
		for r := 0; r < 128; r++ {
			for j := range prompt {
				prompt[j] = 1000 + r*8192 + j
			}
			body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
			resp, err := http.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		st, err := e.Stats()
		if err != nil {
			b.Fatal(err)
		}
		if st.CachedBlocks != 65536 {
			b.Fatalf("%d cached blocks", st.CachedBlocks)
		}
		http.DefaultClient.CloseIdleConnections()
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MB")
		b.ReportMetric(rssMB(), "rss-MB")
		p.Close()
	}
}

// rssMB reads this process's resident set size from /proc.
func rssMB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			var kb float64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:")), "%f", &kb)
			return kb / 1024
		}
	}
	return -1
}
