package collect

import (
	"context"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/verify"
	"github.com/kvroute/kvroute/picker/pickapi"
)

// lagPoll is how often a lag probe asks the picker for its decision: each
// decision counts as a pick in flight on the picker (harmless for a
// prompt under a fresh salt, which no other request shares), so not
// faster.
const lagPoll = 15 * time.Millisecond

// lagGiveUp is how long a lag probe polls after the engine's answer before
// it reports the prompt never predicted.
func lagGiveUp(maxLag time.Duration) time.Duration { return max(5*time.Second, 5*maxLag) }

// lagTarget is one endpoint of a lag probe while it runs.
type lagTarget struct {
	e       debugapi.Endpoint
	r       verify.LagResult
	back    time.Time // when the engine's answer came back
	sent    bool      // the engine answered (or failed)
	settled bool      // predicted, given up, or failed
	decided int       // decisions that answered since
	lastErr error     // the last decision that failed
}

// lagSent is a lag probe's send to one engine coming back.
type lagSent struct {
	i   int
	at  time.Time
	err error
}

// lag runs the lag probe of model: one completion under a fresh salt,
// sent at once straight to every endpoint the picker routes the model to
// (not through the picker, and with no wait for the sidecars), then the
// picker's decision API polled, explained, with the same body until each
// endpoint's candidate matches the prompt's full blocks below its last
// token — or lagGiveUp after its engine's answer. An endpoint of the model
// in another identity group than the one the picker routes it to gets no
// result.
func (c *Collector) lag(ctx context.Context, model string, fleet []debugapi.Endpoint) []verify.LagResult {
	path, body := probeBody("completion", model, salt())
	first, err := c.decide(ctx, body)
	if err != nil {
		return []verify.LagResult{{Model: model, Err: "decision API: " + err.Error()}}
	}
	candidate, routed := map[string]bool{}, ""
	for _, cd := range first.Candidates {
		candidate[cd.Endpoint] = true
		if e, ok := verify.FindEndpoint(fleet, cd.Endpoint); ok && routed == "" {
			routed = e.Group
		}
	}
	var targets []*lagTarget
	var out []verify.LagResult
	for _, e := range fleet {
		r := verify.LagResult{Model: model, Endpoint: e.Endpoint, PromptTokens: first.PromptTokens, BlockSize: e.BlockSize,
			FullTokens: verify.FullBlockTokens(first.PromptTokens, e.BlockSize)}
		switch {
		case e.Model != model:
		case !candidate[e.Endpoint] && (e.Group == "" || e.Group != routed):
			// Another identity group: the picker never routes the model
			// there.
		case !candidate[e.Endpoint]:
			r.Err = fmt.Sprintf("the picker's decision for %s does not consider the endpoint, though it is in the group the model is routed to", model)
			out = append(out, r)
		case r.FullTokens <= 0:
			r.Err = fmt.Sprintf("the probe's %d tokens hold no full block of %d", r.PromptTokens, r.BlockSize)
			out = append(out, r)
		default:
			targets = append(targets, &lagTarget{e: e, r: r})
		}
	}
	back := make(chan lagSent, len(targets))
	for i, t := range targets {
		go func() {
			_, _, err := c.send(ctx, t.e.Endpoint+path, body)
			back <- lagSent{i: i, at: time.Now(), err: err}
		}()
	}
	giveUp := lagGiveUp(c.maxLag)
	took := func(s lagSent) {
		t := targets[s.i]
		t.sent, t.back = true, s.at
		if s.err != nil {
			t.r.Err, t.settled = "sent to the engine: "+s.err.Error(), true
		}
	}
	pending, open := len(targets), func() int {
		n := 0
		for _, t := range targets {
			if t.sent && !t.settled {
				n++
			}
		}
		return n
	}
	// Bounded: every round takes a send back or asks for a decision, the
	// sends are bounded by the timeout, and every endpoint settles at the
	// latest giveUp after its engine answered.
	for pending > 0 || open() > 0 {
		if open() == 0 {
			took(<-back)
			pending--
		}
		for drained := false; !drained; {
			select {
			case s := <-back:
				took(s)
				pending--
			default:
				drained = true
			}
		}
		if open() == 0 {
			continue
		}
		a, err := c.decide(ctx, body)
		answered := time.Now()
		for _, t := range targets {
			if !t.sent || t.settled {
				continue
			}
			t.r.Polls++
			t.r.WaitedSecs = answered.Sub(t.back).Seconds()
			if err != nil {
				t.lastErr = err
			} else {
				t.decided++
				m := matchedOn(a, t.e.Endpoint)
				t.r.MostPredicted = max(t.r.MostPredicted, m)
				if m >= t.r.FullTokens {
					t.r.Predicted, t.r.LagSecs, t.settled = true, max(answered.Sub(t.back), 0).Seconds(), true
					continue
				}
			}
			switch {
			case ctx.Err() != nil:
				t.r.Err, t.settled = ctx.Err().Error(), true
			case answered.Sub(t.back) >= giveUp:
				t.settled = true
				if t.decided == 0 && t.lastErr != nil {
					t.r.Err = "decision API: " + t.lastErr.Error()
				}
			}
		}
		if open() > 0 {
			sleep(ctx, lagPoll) // a cancelled ctx settles the rest next round
		}
	}
	for _, t := range targets {
		out = append(out, t.r)
	}
	c.pickerStates(ctx, out)
	return out
}

// matchedOn is the GPU tokens an explained decision predicts on endpoint.
func matchedOn(a pickapi.Answer, endpoint string) int {
	for _, cd := range a.Candidates {
		if cd.Endpoint == endpoint {
			return cd.MatchedTokens
		}
	}
	return 0
}

// pickerStates fills in, for the lag probes never predicted, the picker's
// state of their endpoints now (when it reports one).
func (c *Collector) pickerStates(ctx context.Context, lags []verify.LagResult) {
	need := false
	for _, l := range lags {
		need = need || (l.Endpoint != "" && l.Err == "" && !l.Predicted)
	}
	if !need {
		return
	}
	var doc debugapi.Document
	if err := c.getJSON(ctx, c.admin+debugapi.Path, &doc); err != nil {
		return
	}
	for i, l := range lags {
		if e, ok := verify.FindEndpoint(doc.Endpoints, l.Endpoint); ok && l.Err == "" && !l.Predicted {
			lags[i].PickerState, lags[i].PickerReason = e.State, e.StateReason
		}
	}
}
