package peers

import (
	"math"
	"slices"
	"time"
)

// llm-d's calibration recipe for the affinity filter's load gate
// (guides/recipes/router/calibration/calibrate.sh, shared/docs/
// peer-policies.md §1.2 "Calibration"): CalibrationWarmup requests, then
// CalibrationRequests measured ones, one at a time, each a streaming
// completion of exactly CHUNK random token ids (so each misses the
// cache) asking for one token, CHUNK being the engine's
// --max-num-batched-tokens; the TTFT is the time to the first data
// chunk. CalibratedPeak turns the measured TTFTs into the peak prefill
// throughput, and the load gate's TTFT penalty is CalibrationTMax (the
// recipe's T_MAX_SECONDS default), so τ = peak × 18 s.
const (
	CalibrationWarmup   = 5
	CalibrationRequests = 20
	CalibrationTMax     = 18 * time.Second
)

// CalibratedPeak is the peak prefill throughput, in tokens per second,
// that llm-d's recipe derives from the measured requests' TTFTs: chunk ÷
// the median TTFT (the two middle values' mean for an even count, as
// Python's statistics.median), truncated to whole tokens per second as
// the recipe prints it. 0 when there is nothing to derive it from: no
// TTFT, a chunk or a median that is not positive.
func CalibratedPeak(chunk int, ttfts []time.Duration) float64 {
	if chunk <= 0 || len(ttfts) == 0 {
		return 0
	}
	med := MedianDuration(ttfts)
	if med <= 0 {
		return 0
	}
	return math.Floor(float64(chunk) / med.Seconds())
}

// MedianDuration is the median of d (the two middle values' mean for an
// even count); 0 for none. d is not modified.
func MedianDuration(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return s[n/2-1] + (s[n/2]-s[n/2-1])/2
}
