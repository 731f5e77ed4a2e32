//go:build !enginesim_core

package enginesim

// This file stands in for offload_core.go until the scheduler core's CPU
// tier and pulls land (sched.Request.Source, Step.Lookups, Resolve,
// ServeLookup, the Step's connector figures, kvcache's CPU tier, package
// transfer): the same functions, doing nothing. Build with -tags
// enginesim_core to compile offload_core.go against them instead; once
// they are in, delete this file and the build line of offload_core.go.

import (
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// setSource names the request's KV source for the core.
func setSource(*sched.Request, kvSource) {}

// offloadCache sizes the core's CPU tier from the connector's settings.
func offloadCache(*kvcache.Config, *Config) {}

// stepOffload is a step's connector figures.
func stepOffload(st sched.Step) offloadStep { return offloadStep{PromptTokens: st.PromptTokens} }

// lookupsOf is the probes a step asks for.
//
//lint:ignore U1000 the loop calls it once the core's lookups land
func lookupsOf(sched.Step) []lookup { return nil }

// serveLookup answers a peer from the CPU tier (scheduler goroutine).
func (e *Engine) serveLookup([]blockkey.Digest) int { return 0 }

// resolvePull hands a pull's outcome to the core, at simulated time now.
//
//lint:ignore U1000 the loop calls it once the core's lookups land
func (e *Engine) resolvePull(pullDone, time.Duration) {}

// pullDuration is a pull's transfer time.
func pullDuration(profile.Profile, int, int, int, bool) time.Duration { return 0 }

// resetConnector empties the CPU tier (scheduler goroutine).
func (e *Engine) resetConnector() {}

// h2dBandwidth is the profile's host-to-device bandwidth, bytes a second.
func h2dBandwidth(profile.Profile) float64 { return 0 }
