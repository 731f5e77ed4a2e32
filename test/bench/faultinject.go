package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// The faults scenario's injection: how each fault is done, held and
// undone on the process fleet, and when the fleet is back.

// injected is a fault as it happened.
type injected struct {
	name, target       string
	at, restored       time.Time
	incident           *Incident
	inFlightOn, picker string // the engine or picker whose in-flight requests are counted
}

// died is when the fault's process was seen dead (its injection for a
// fault without an incident or a stop).
func (f injected) died() time.Time {
	if f.incident != nil && !f.incident.Until.IsZero() {
		return f.incident.Until
	}
	return f.at
}

// Fault holds, in scenario time: how long a killed process stays down, a
// stopped one stopped, event loss and a partition last. A partition lasts
// at least partitionWall of wall time, for gossip's failure detector.
const (
	downHold      = 5 * time.Second
	eventLossHold = 20 * time.Second
	partitionHold = 15 * time.Second
	partitionWall = 10 * time.Second
	readyBound    = 60 * time.Second
)

// faultInjection does one fault on the fleet, holds it and undoes it,
// filling in (target, at, incident, the in-flight counts' process); it
// returns once the fault is undone and the fleet is back.
type faultInjection func(ctx context.Context, f *procFleet, c *Client, in *injected) error

// injection is the named fault's (FaultNames); nil for an unknown name.
func injection(name string) faultInjection {
	switch name {
	case "engine-sigkill":
		return injectEngineKill
	case "engine-sigstop":
		return injectEngineStop
	case "reset-prefix-cache":
		return injectCacheReset
	case "event-loss":
		return injectEventLoss
	case "sidecar-sigkill":
		return injectSidecarKill
	case "picker-sigterm", "picker-sigkill":
		return injectPickerSignal
	case "gossip-partition":
		return injectPartition
	}
	return nil
}

// inject injects the named fault, holds it, undoes it and waits until the
// fleet is back (restored).
func inject(ctx context.Context, f *procFleet, c *Client, name string) (injected, error) {
	in := injected{name: name}
	do := injection(name)
	if do == nil {
		return in, fmt.Errorf("unknown fault %q", name)
	}
	if err := do(ctx, f, c, &in); err != nil {
		return in, err
	}
	in.restored = time.Now()
	return in, nil
}

// injectEngineKill SIGKILLs the second engine, keeps it down for downHold
// and restarts it, until its /health answers.
func injectEngineKill(ctx context.Context, f *procFleet, c *Client, in *injected) error {
	e := f.engines[1%len(f.engines)]
	in.target, in.inFlightOn = e.url, e.url
	in.at = time.Now()
	in.incident = &Incident{Kind: IncidentEngine, Target: e.url, At: in.at}
	if err := e.engine.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if err := e.engine.wait(10 * time.Second); err != nil {
		return err
	}
	in.incident.Until = time.Now()
	if !c.Wait(ctx, downHold) {
		return ctx.Err()
	}
	if err := e.engine.start(); err != nil {
		return err
	}
	return await(ctx, readyBound, func() error { return httpOK(ctx, e.url+"/health") })
}

// injectEngineStop SIGSTOPs the third engine for downHold, then SIGCONTs
// it.
func injectEngineStop(ctx context.Context, f *procFleet, c *Client, in *injected) error {
	e := f.engines[2%len(f.engines)]
	in.target, in.inFlightOn = e.url, e.url
	in.at = time.Now()
	in.incident = &Incident{Kind: IncidentEngine, Target: e.url, At: in.at}
	if err := e.engine.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	ok := c.Wait(ctx, downHold)
	if err := e.engine.signal(syscall.SIGCONT); err != nil || !ok {
		return cmp.Or(err, ctx.Err())
	}
	return nil
}

// injectCacheReset resets the fourth engine's prefix cache, running
// requests included: a one-shot fault.
func injectCacheReset(ctx context.Context, f *procFleet, _ *Client, in *injected) error {
	e := f.engines[3%len(f.engines)]
	in.target, in.at = e.url, time.Now()
	return postJSON(ctx, e.url+"/reset_prefix_cache?reset_running_requests=true", nil)
}

// injectEventLoss has every engine drop 10% of its event batches for
// eventLossHold.
func injectEventLoss(ctx context.Context, f *procFleet, c *Client, in *injected) error {
	in.target, in.at = "every engine (10% of event batches dropped, replay on)", time.Now()
	for _, e := range f.engines {
		if err := postJSON(ctx, e.url+"/sim/faults", map[string]any{"drop_events_pct": 10}); err != nil {
			return err
		}
	}
	ok := c.Wait(ctx, eventLossHold)
	for _, e := range f.engines {
		if err := postJSON(ctx, e.url+"/sim/faults", map[string]any{"drop_events_pct": 0}); err != nil {
			return err
		}
	}
	if !ok {
		return ctx.Err()
	}
	return nil
}

// injectSidecarKill SIGKILLs the third engine's sidecar, keeps it down for
// downHold and restarts it, until its /readyz answers.
func injectSidecarKill(ctx context.Context, f *procFleet, c *Client, in *injected) error {
	e := f.engines[2%len(f.engines)]
	in.target, in.at = "sidecar of "+e.url, time.Now()
	if err := e.sidecar.signal(syscall.SIGKILL); err != nil {
		return err
	}
	if err := e.sidecar.wait(10 * time.Second); err != nil {
		return err
	}
	if !c.Wait(ctx, downHold) {
		return ctx.Err()
	}
	if err := e.sidecar.start(); err != nil {
		return err
	}
	return await(ctx, readyBound, func() error { return httpOK(ctx, e.sidecarDebug+"/readyz") })
}

// injectPickerSignal drains the first picker (picker-sigterm) or SIGKILLs
// the second (picker-sigkill), waits for its exit — and, for a kill, for
// the client's Service view to drop it, then downHold — and restarts it,
// until its /readyz answers.
func injectPickerSignal(ctx context.Context, f *procFleet, c *Client, in *injected) error {
	p := f.pickers[0]
	sig := syscall.SIGTERM
	if in.name == "picker-sigkill" {
		p, sig = f.pickers[1%len(f.pickers)], syscall.SIGKILL
	}
	in.target, in.picker = p.url, p.url
	in.at = time.Now()
	if sig == syscall.SIGKILL {
		in.incident = &Incident{Kind: IncidentPicker, Target: p.url, At: in.at}
	}
	if err := p.p.signal(sig); err != nil {
		return err
	}
	if err := p.p.wait(f.cfg.DrainDelay + 45*time.Second); err != nil { // the drain, then the shutdown timeout
		return err
	}
	if in.incident != nil {
		// Until the client's Service view drops the dead picker (its
		// first failed /readyz probe), requests still go to it — on
		// kept-alive connections, which break (a refused new one is
		// retried): the kill's doing, not routing's.
		if err := await(ctx, 10*time.Second, func() error { return c.pool.inRotation(p.url) }); err != nil {
			return err
		}
		in.incident.Until = time.Now()
	}
	if sig == syscall.SIGKILL && !c.Wait(ctx, downHold) {
		return ctx.Err()
	}
	if err := p.p.start(); err != nil {
		return err
	}
	return await(ctx, readyBound, func() error { return httpOK(ctx, p.admin+"/readyz") })
}

// injectPartition cuts the fourth engine's sidecar off gossip for
// partitionHold (at least partitionWall of wall time), then heals it.
func injectPartition(ctx context.Context, f *procFleet, c *Client, in *injected) error {
	e := f.engines[3%len(f.engines)]
	in.target, in.at = "sidecar of "+e.url, time.Now()
	if err := postJSON(ctx, e.sidecarDebug+"/debug/fault/gossip", map[string]any{"partitioned": true}); err != nil {
		return err
	}
	ok := c.WaitUntil(ctx, time.Now().Add(max(c.Wall(partitionHold), partitionWall)))
	if err := postJSON(ctx, e.sidecarDebug+"/debug/fault/gossip", map[string]any{"partitioned": false}); err != nil || !ok {
		return cmp.Or(err, ctx.Err())
	}
	return nil
}

// postJSON posts v (nil: no body) and wants a 2xx.
func postJSON(ctx context.Context, url string, v any) error {
	var body io.Reader
	if v != nil {
		b, _ := json.Marshal(v)
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}
