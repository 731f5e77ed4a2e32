package verify

import "testing"

func TestJudgeStream(t *testing.T) {
	const e = "http://10.0.0.1:8000"
	const bind = "the engine connects (its --kv-events-config endpoint names a concrete host) and so does the sidecar: run the sidecar with --kv-events-mode bind"
	seen := func(state, reason string) StreamFacts {
		return StreamFacts{DebugURL: "http://10.0.0.1:9091", Found: true, Reported: true, State: state, Reason: reason, Served: true, WaitedSecs: 5}
	}
	for _, tc := range []struct {
		name          string
		f             StreamFacts
		ok            bool
		detail, cause string
	}{
		{"live", seen(StreamLive, ""), true, "the live KV event stream delivers", ""},
		{"live with a note", seen(StreamLive, "live batches every 40 ms"), true, "delivers", ""},
		{"silent: the sidecar's reason is the cause", seen(StreamSilent, bind), false, `the sidecar judges the live KV event stream "silent"`, "--kv-events-mode bind"},
		{"replay only", seen(StreamReplayOnly, bind), false, `"replay_only"`, bind},
		{"partial", seen(StreamPartial, "events 120–180 lost and not replayable"), false, `"partial"`, "events 120–180 lost"},
		{"silent without a reason", seen(StreamSilent, ""), false, `"silent"`, "--kv-events-mode bind"},
		{"replay only without a reason", seen(StreamReplayOnly, ""), false, `"replay_only"`, "--kv-events-mode bind"},
		{"partial without a reason", seen(StreamPartial, ""), false, `"partial"`, "replay endpoint"},
		{"a state this version does not know", seen("wobbly", ""), false, `"wobbly"`, "does not know"},
		{"unknown after verify's requests", seen(StreamUnknown, ""), false,
			`the engine served requests but the sidecar saw no event: stream_state still "unknown" after 5.0 s`, "--kv-events-mode bind"},
		{"unknown, with the sidecar's reason", seen(StreamUnknown, "no batch since start"), false, "saw no event", "no batch since start"},
		{"unknown before any request", func() StreamFacts { f := seen(StreamUnknown, ""); f.Served = false; return f }(), true, "no evidence yet", ""},
		{"an older sidecar", StreamFacts{DebugURL: "http://d", Found: true, Served: true}, false,
			"the sidecar does not report stream_state", "upgrade"},
		{"engine down beats a live stream", func() StreamFacts {
			f := seen(StreamLive, "")
			f.EngineDown, f.EngineError = true, "GET /health: connection refused"
			return f
		}(), false, "the sidecar reports its engine down: GET /health: connection refused", "--engine-url"},
		{"debug URL unknown", StreamFacts{}, false, "debug URL is unknown", "--admin-advertise"},
		{"unreachable", StreamFacts{DebugURL: "http://d", Err: "connection refused"}, false, "connection refused", "not reachable"},
		{"no entry of this rank", StreamFacts{DebugURL: "http://d", Rank: 1, Err: ""}, false, "the sidecar at http://d has no rank 1 of this endpoint", "another sidecar"},
	} {
		tc.f.Endpoint = e
		c := JudgeStream(tc.f)
		if c.Name != "sidecar stream" || c.Endpoint != e {
			t.Errorf("%s: %+v", tc.name, c)
		}
		judged(t, tc.name, c, tc.ok, tc.detail, tc.cause)
	}
}
