package collect

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/verify"
)

// maxMetricsBytes bounds what is read of one /metrics page.
const maxMetricsBytes = 64 << 20

// metrics reads /metrics on the picker's admin port, then on each
// sidecar's admin port the fleet lists (each once, in the fleet's order).
func (c *Collector) metrics(ctx context.Context, fleet []debugapi.Endpoint) []verify.MetricsFacts {
	out := []verify.MetricsFacts{c.metricsOf(ctx, verify.ComponentPicker, c.admin)}
	seen := map[string]bool{}
	for _, e := range fleet {
		u := strings.TrimRight(e.SidecarDebug, "/")
		if u == "" || seen[u] {
			continue
		}
		seen[u] = true
		out = append(out, c.metricsOf(ctx, verify.ComponentSidecar, u))
	}
	return out
}

// metricsOf reads the series names base/metrics serves, in Prometheus's
// text format.
func (c *Collector) metricsOf(ctx context.Context, component, base string) verify.MetricsFacts {
	f := verify.MetricsFacts{Component: component, URL: base}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		f.Err = fmt.Sprintf("%s/metrics: status %d", base, resp.StatusCode)
		return f
	}
	if f.Names, err = seriesNames(resp.Body); err != nil {
		f.Names, f.Err = nil, fmt.Sprintf("%s/metrics: %v", base, err)
	}
	return f
}

// seriesNames returns the metric name of every sample of a page in
// Prometheus's text format, sorted and each once.
func seriesNames(r io.Reader) ([]string, error) {
	lr := &io.LimitedReader{R: r, N: maxMetricsBytes + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	seen := map[string]bool{}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		seen[name] = true
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if lr.N <= 0 {
		return nil, fmt.Errorf("larger than %d MiB", maxMetricsBytes>>20)
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}
