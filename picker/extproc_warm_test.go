package picker_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/extproc"
)

// BenchmarkEPPWarmReturns: the same multi-turn conversations through the
// endpoint picker (the benchmark playing Envoy, full-duplex streamed) and
// through the proxy, on one fleet of 4 engines, each path with its own
// tenants' salts so neither warms the other's cache. Turns go round by
// round, every conversation's turn k before any turn k+1, as interleaved
// agents do. Reports each path's warm-return rate (turn k+1 on the
// endpoint that served turn k) and the ratio.
func BenchmarkEPPWarmReturns(b *testing.B) {
	const conversations, turns = 12, 4
	f := startFleetWith(b, 4, picker.DefaultConfig(), "", nil)
	conn := serveEPP(b, f.router, extproc.DefaultConfig())
	body := func(salt string, conv, turn int) string {
		var msgs []string
		for k := 0; k <= turn; k++ {
			msgs = append(msgs, fmt.Sprintf("Conversation %d, question %d: %s", conv, k, strings.Repeat("context words ", 40)))
			if k < turn {
				msgs = append(msgs, fmt.Sprintf("Answer %d to conversation %d.", k, conv))
			}
		}
		return chatBody(salt, msgs...)
	}
	viaEPP := func(salt string, conv, turn int) string {
		g := openGateway(b, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
		route, _ := g.sendRequest([]byte(body(salt, conv, turn)), nil)
		served := strings.Split(route, ",")[0]
		resp, raw := forward(b, served, body(salt, conv, turn))
		g.sendResponse(served, resp, raw)
		return served
	}
	viaProxy := func(salt string, conv, turn int) string {
		resp, err := http.Post(f.api.URL+"/v1/chat/completions", "application/json", strings.NewReader(body(salt, conv, turn)))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("proxy: status %d", resp.StatusCode)
		}
		return strings.TrimPrefix(resp.Header.Get("X-Kvroute-Endpoint"), "http://")
	}
	warm := map[string]int{}
	total := 0
	for i := range b.N {
		last := map[string][]string{"epp": make([]string, conversations), "proxy": make([]string, conversations)}
		for turn := range turns {
			for conv := range conversations {
				for path, send := range map[string]func(string, int, int) string{"epp": viaEPP, "proxy": viaProxy} {
					got := send(fmt.Sprintf("%s-%d-%d", path, i, conv), conv, turn)
					if turn > 0 && got == last[path][conv] {
						warm[path]++
					}
					last[path][conv] = got
				}
			}
			f.awaitLoadReports(b) // the turns' blocks and loads reported, for both paths alike
		}
		total += conversations * (turns - 1)
	}
	b.ReportMetric(float64(warm["epp"])/float64(total), "epp-warm-rate")
	b.ReportMetric(float64(warm["proxy"])/float64(total), "proxy-warm-rate")
	if warm["proxy"] > 0 {
		b.ReportMetric(float64(warm["epp"])/float64(warm["proxy"]), "epp/proxy")
	}
}
