package extproc

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// op is one input to a flow: a gateway message, or the shell's decision.
type op struct {
	ev      *Event
	rewrite string // Rewrite(rewrite), then Route(route)
	route   string // Route(route)
	refuse  int    // Refuse(refuse, "no")
	want    string // the replies and step flags, as show writes them
	err     string // an error containing this
}

func msg(k Kind, eos bool, data string) *Event {
	return &Event{Kind: k, EndOfStream: eos, Data: []byte(data)}
}

// show writes replies and flags compactly, for table tests.
func show(s Step, replies []Reply) string {
	var parts []string
	for _, r := range append(s.Replies, replies...) {
		p := r.Kind.String()
		if r.Route != "" {
			p += " route=" + r.Route
		}
		if r.ClearRouteCache {
			p += " clear"
		}
		if r.ContentLength > 0 {
			p += fmt.Sprintf(" cl=%d", r.ContentLength)
		}
		if r.Replace {
			p += fmt.Sprintf(" replace=%q", r.Chunk)
		}
		if r.Streamed {
			p += fmt.Sprintf(" chunk=%q", r.Chunk)
			if r.EndOfStream {
				p += " eos"
			}
		}
		if r.ModeOverride != 0 {
			p += " override=" + r.ModeOverride.String()
		}
		if r.Kind == Immediate {
			p += fmt.Sprintf(" %d %s", r.Status, r.Body)
		}
		parts = append(parts, p)
	}
	if s.Decide {
		parts = append(parts, "DECIDE")
	}
	if s.TooLarge {
		parts = append(parts, "TOO_LARGE")
	}
	if s.ResponseEnded {
		parts = append(parts, "ENDED")
	}
	return strings.Join(parts, "; ")
}

func run(t *testing.T, f *Flow, ops []op) {
	t.Helper()
	for i, o := range ops {
		var s Step
		var replies []Reply
		var err error
		switch {
		case o.ev != nil:
			s, err = f.Step(*o.ev)
		case o.route != "":
			if o.rewrite != "" {
				if err = f.Rewrite([]byte(o.rewrite)); err != nil {
					break
				}
			}
			replies, err = f.Route(o.route)
		default:
			replies, err = f.Refuse(o.refuse, []byte("no"))
		}
		if o.err != "" {
			if err == nil || !strings.Contains(err.Error(), o.err) {
				t.Fatalf("op %d: error %v, want one with %q", i, err, o.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		if got := show(s, replies); got != o.want {
			t.Fatalf("op %d:\n got %s\nwant %s", i, got, o.want)
		}
	}
}

// response is the answer's part of an exchange, the same in every mode
// but FULL_DUPLEX_STREAMED.
func response() []op {
	return []op{
		{ev: msg(ResponseHeaders, false, ""), want: "response_headers"},
		{ev: msg(ResponseBody, false, "da"), want: "response_body"},
		{ev: msg(ResponseBody, true, "ta"), want: "response_body; ENDED"},
	}
}

func TestFlow(t *testing.T) {
	dup := Protocol{RequestBody: FullDuplex, ResponseBody: FullDuplex}
	for _, tc := range []struct {
		name  string
		proto Protocol
		ops   []op
	}{
		{name: "full duplex: chunks are held until the end, then headers with the route, the body streamed back", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(RequestBody, false, `{"a":`), want: ""},
			{ev: msg(RequestBody, true, `1}`), want: "DECIDE"},
			{route: "10.0.0.1:8000,10.0.0.2:8000", want: `request_headers route=10.0.0.1:8000,10.0.0.2:8000 clear cl=7; request_body chunk="{\"a\":1}" eos`},
			{ev: msg(ResponseHeaders, false, ""), want: "response_headers"},
			{ev: msg(ResponseBody, false, "da"), want: `response_body chunk="da"`},
			{ev: msg(ResponseBody, true, "ta"), want: `response_body chunk="ta" eos; ENDED`},
		}},
		{name: "full duplex: trailers end the body; the last chunk does not, a trailers answer follows", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(RequestBody, false, `{}`), want: ""},
			{ev: msg(RequestTrailers, false, ""), want: "DECIDE"},
			{route: "a:1", want: `request_headers route=a:1 clear cl=2; request_body chunk="{}"; request_trailers`},
			{ev: msg(ResponseHeaders, false, ""), want: "response_headers"},
			{ev: msg(ResponseTrailers, false, ""), want: "response_trailers; ENDED"},
		}},
		{name: "full duplex: an empty body is one empty chunk", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(RequestBody, true, ""), want: "DECIDE"},
			{route: "a:1", want: `request_headers route=a:1 clear; request_body chunk="" eos`},
		}},
		{name: "buffered: headers at once, the route on the body's answer", proto: Protocol{RequestBody: Buffered, ResponseBody: Buffered}, ops: append([]op{
			{ev: msg(RequestHeaders, false, ""), want: "request_headers clear"},
			{ev: msg(RequestBody, true, `{}`), want: "DECIDE"},
			{route: "a:1", want: "request_body route=a:1 clear"},
		}, response()...)},
		{name: "buffered partial: the one message is decided on, eos or not", proto: Protocol{RequestBody: BufferedPartial}, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: "request_headers clear"},
			{ev: msg(RequestBody, false, `{"cut`), want: "DECIDE"},
			{route: "a:1", want: "request_body route=a:1 clear"},
			{ev: msg(RequestBody, true, `"}`), want: "request_body"},
			{ev: msg(RequestTrailers, false, ""), want: "request_trailers"},
		}},
		{name: "streamed, body sent without waiting: headers held, one answer per chunk after them", proto: Protocol{RequestBody: Streamed, ResponseBody: Streamed, BodyWithoutWaiting: true}, ops: append([]op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(RequestBody, false, `{"a":`), want: ""},
			{ev: msg(RequestBody, false, `1`), want: ""},
			{ev: msg(RequestBody, true, `}`), want: "DECIDE"},
			{route: "a:1", want: "request_headers route=a:1 clear; request_body; request_body; request_body"},
		}, response()...)},
		{name: "streamed, the gateway waiting: a mode override to buffered", proto: Protocol{RequestBody: Streamed, ResponseBody: Streamed}, ops: append([]op{
			{ev: msg(RequestHeaders, false, ""), want: "request_headers override=BUFFERED"},
			{ev: msg(RequestBody, true, `{}`), want: "DECIDE"},
			{route: "a:1", want: "request_body route=a:1 clear"},
		}, response()...)},
		{name: "no body: decided on the headers", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, true, ""), want: "DECIDE"},
			{route: "a:1", want: "request_headers route=a:1 clear"},
			{ev: msg(ResponseHeaders, true, ""), want: "response_headers; ENDED"},
		}},
		{name: "request body mode NONE: decided on the headers", proto: Protocol{RequestBody: None, ResponseBody: None}, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: "DECIDE"},
			{route: "a:1", want: "request_headers route=a:1 clear"},
		}},
		{name: "a refusal ends the exchange; later messages get nothing", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(RequestBody, true, `{}`), want: "DECIDE"},
			{refuse: 503, want: "immediate_response 503 no"},
			{ev: msg(RequestTrailers, false, ""), want: ""},
			{route: "a:1", err: "after an immediate response"},
			{refuse: 503, err: "twice"},
		}},
		{name: "a body past the bound asks for a refusal", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(RequestBody, false, "12345"), want: ""},
			{ev: msg(RequestBody, false, "123456"), want: "TOO_LARGE"},
			{refuse: 413, want: "immediate_response 413 no"},
		}},
		{name: "out of order: body before headers", proto: dup, ops: []op{
			{ev: msg(RequestBody, true, "{}"), err: "before the request headers"},
		}},
		{name: "out of order: a second request on the stream", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, true, ""), want: "DECIDE"},
			{route: "a:1", want: "request_headers route=a:1 clear"},
			{ev: msg(RequestHeaders, true, ""), err: "before the response headers"},
		}},
		{name: "out of order: a response before the decision", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(ResponseHeaders, false, ""), err: "while the request body was arriving"},
		}},
		{name: "out of order: a route before the body ended", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{route: "a:1", err: "before the request was whole"},
		}},
		{name: "out of order: after the response ended", proto: dup, ops: []op{
			{ev: msg(RequestHeaders, true, ""), want: "DECIDE"},
			{route: "a:1", want: "request_headers route=a:1 clear"},
			{ev: msg(ResponseHeaders, true, ""), want: "response_headers; ENDED"},
			{ev: msg(ResponseBody, true, ""), err: "after the response ended"},
		}},
		{name: "GRPC mode is refused with a clear error", proto: Protocol{RequestBody: GRPC}, ops: []op{
			{ev: msg(RequestHeaders, false, ""), err: "GRPC body send mode is not supported"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, NewFlow(10, tc.proto), tc.ops)
		})
	}
}

// TestFlowChunksALargeBody: a body past ChunkBytes goes back in chunks of
// at most ChunkBytes, in order, whole, the last ending the stream.
// TestFlowRewrite: a body the shell rewrote goes on as rewritten in
// every mode, its content-length set: streamed back (FULL_DUPLEX), in
// place of the buffered body, or in place of the first held STREAMED
// message with the others cleared; never for a request without a body.
func TestFlowRewrite(t *testing.T) {
	for _, tc := range []struct {
		name  string
		proto Protocol
		ops   []op
	}{
		{name: "full duplex", proto: Protocol{RequestBody: FullDuplex}, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(RequestBody, false, `{"a":`), want: ""},
			{ev: msg(RequestBody, true, `1}`), want: "DECIDE"},
			{rewrite: `{"a":1,"s":"x"}`, route: "a:1", want: `request_headers route=a:1 clear cl=15; request_body chunk="{\"a\":1,\"s\":\"x\"}" eos`},
		}},
		{name: "buffered", proto: Protocol{RequestBody: Buffered}, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: "request_headers clear"},
			{ev: msg(RequestBody, true, `{}`), want: "DECIDE"},
			{rewrite: `{"s":"x"}`, route: "a:1", want: `request_body route=a:1 clear cl=9 replace="{\"s\":\"x\"}"`},
		}},
		{name: "streamed, waiting: buffered", proto: Protocol{RequestBody: Streamed}, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: "request_headers override=BUFFERED"},
			{ev: msg(RequestBody, true, `{}`), want: "DECIDE"},
			{rewrite: `{"s":"x"}`, route: "a:1", want: `request_body route=a:1 clear cl=9 replace="{\"s\":\"x\"}"`},
		}},
		{name: "streamed without waiting", proto: Protocol{RequestBody: Streamed, BodyWithoutWaiting: true}, ops: []op{
			{ev: msg(RequestHeaders, false, ""), want: ""},
			{ev: msg(RequestBody, false, `{"a":`), want: ""},
			{ev: msg(RequestBody, true, `1}`), want: "DECIDE"},
			{rewrite: `{"a":1,"s":"x"}`, route: "a:1", want: `request_headers route=a:1 clear cl=15; request_body replace="{\"a\":1,\"s\":\"x\"}"; request_body replace=""`},
		}},
		{name: "no body", proto: Protocol{RequestBody: FullDuplex}, ops: []op{
			{ev: msg(RequestHeaders, true, ""), want: "DECIDE"},
			{rewrite: `{}`, route: "a:1", err: "without a body"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { run(t, NewFlow(1<<20, tc.proto), tc.ops) })
	}
}

func TestFlowChunksALargeBody(t *testing.T) {
	f := NewFlow(1<<20, Protocol{RequestBody: FullDuplex, ResponseBody: FullDuplex})
	body := bytes.Repeat([]byte("x"), 2*ChunkBytes+5)
	if _, err := f.Step(Event{Kind: RequestHeaders}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(body); i += 1000 {
		end := min(i+1000, len(body))
		s, err := f.Step(Event{Kind: RequestBody, Data: body[i:end], EndOfStream: end == len(body)})
		if err != nil || s.Decide != (end == len(body)) {
			t.Fatalf("chunk at %d: %+v %v", i, s, err)
		}
	}
	if !bytes.Equal(f.Body(), body) {
		t.Fatal("the body was not accumulated whole")
	}
	replies, err := f.Route("a:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(replies) != 4 || replies[0].ContentLength != len(body) {
		t.Fatalf("%d replies, content-length %d", len(replies), replies[0].ContentLength)
	}
	var back []byte
	for i, r := range replies[1:] {
		if !r.Streamed || len(r.Chunk) > ChunkBytes || r.EndOfStream != (i == 2) {
			t.Fatalf("chunk %d: %d bytes, eos %v", i, len(r.Chunk), r.EndOfStream)
		}
		back = append(back, r.Chunk...)
	}
	if !bytes.Equal(back, body) {
		t.Fatal("the body sent back differs")
	}
}

// TestFlowConfigure: the protocol the gateway announces replaces the
// assumed one; a bodiless request has a nil body, a body-carrying one
// never does.
func TestFlowConfigure(t *testing.T) {
	f := NewFlow(10, Protocol{RequestBody: FullDuplex})
	f.Configure(Protocol{RequestBody: Buffered, ResponseBody: Buffered})
	s, err := f.Step(Event{Kind: RequestHeaders})
	if err != nil || len(s.Replies) != 1 || f.Protocol().RequestBody != Buffered {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := f.Step(Event{Kind: RequestBody, EndOfStream: true}); err != nil || f.Body() == nil {
		t.Fatalf("an empty body read as none: %v", err)
	}
	g := NewFlow(10, Protocol{RequestBody: FullDuplex})
	if _, err := g.Step(Event{Kind: RequestHeaders, EndOfStream: true}); err != nil || g.Body() != nil {
		t.Fatal("a bodiless request has a body")
	}
}

func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.Fallbacks = 8 },
		func(c *Config) { c.Fallbacks = -1 },
		func(c *Config) { c.ShedWaiting = -1 },
		func(c *Config) { c.BodyTimeout = 0 },
		func(c *Config) { c.Assume = None },
	} {
		c := DefaultConfig()
		bad(&c)
		if c.Validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
	for _, s := range []string{"full-duplex-streamed", "streamed", "buffered", "BUFFERED"} {
		if _, err := ParseMode(s); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseMode("grpc"); err == nil {
		t.Error("grpc parsed")
	}
}
