package extproc

import "fmt"

// ChunkBytes bounds one streamed body chunk the picker sends back: below
// the 64 KiB some gateways take at most, as GIE's picker does.
const ChunkBytes = 62000

// Kind names a message of the exchange, in either direction.
type Kind int

// The messages. Immediate is a reply only: an ImmediateResponse.
const (
	RequestHeaders Kind = iota + 1
	RequestBody
	RequestTrailers
	ResponseHeaders
	ResponseBody
	ResponseTrailers
	Immediate
)

func (k Kind) String() string {
	switch k {
	case RequestHeaders:
		return "request_headers"
	case RequestBody:
		return "request_body"
	case RequestTrailers:
		return "request_trailers"
	case ResponseHeaders:
		return "response_headers"
	case ResponseBody:
		return "response_body"
	case ResponseTrailers:
		return "response_trailers"
	case Immediate:
		return "immediate_response"
	}
	return fmt.Sprintf("message %d", int(k))
}

// Event is one message from the gateway, as the flow needs it.
type Event struct {
	Kind        Kind // RequestHeaders … ResponseTrailers
	EndOfStream bool // headers and bodies: nothing follows in this direction
	Data        []byte
}

// Reply is one message to the gateway.
type Reply struct {
	Kind Kind
	// Route, when set, is the destination: the x-gateway-destination-endpoint
	// header and the envoy.lb dynamic metadata entry of the same name.
	Route string
	// ClearRouteCache asks the gateway to route again (the destination
	// header changed).
	ClearRouteCache bool
	// ContentLength, when positive, sets content-length: the request body
	// sent back whole in FULL_DUPLEX_STREAMED mode.
	ContentLength int
	// Streamed: a StreamedBodyResponse carrying Chunk, ending the body
	// when EndOfStream (FULL_DUPLEX_STREAMED). Replace: a body mutation
	// putting Chunk in place of the message's body (clearing it when
	// Chunk is empty: BUFFERED, STREAMED; the body was rewritten).
	// Otherwise a body reply leaves the chunk as it is.
	Streamed    bool
	Replace     bool
	Chunk       []byte
	EndOfStream bool
	// ModeOverride, when set, asks the gateway to send the request body
	// in this mode from now on (mode_override).
	ModeOverride Mode
	// Status and Body are an immediate response's; RetryAfter, when
	// set, its Retry-After header.
	Status     int
	Body       []byte
	RetryAfter string
}

// Step is what the flow made of an event.
type Step struct {
	Replies []Reply
	// Decide: the request is whole; the shell decides on Body (nil for a
	// request without a body, or one the gateway does not send) and calls
	// Route or Refuse.
	Decide bool
	// TooLarge: the request body went past the bound; the shell calls
	// Refuse (413).
	TooLarge bool
	// ResponseEnded: the answer is whole (its last body chunk, its
	// trailers, or headers with nothing after them).
	ResponseEnded bool
}

type state int

const (
	awaitHeaders state = iota
	inBody             // reading the request body
	deciding           // the shell is deciding
	forwarded          // the request went on; the answer has not come
	inResponse         // reading the answer
	finished           // the answer ended
	refused            // an immediate response went: nothing more is answered
)

// Flow is one ext_proc stream's message flow: which message is answered
// how and when. Pure: it holds the request body and counts, and does no
// I/O. Not safe for concurrent use.
type Flow struct {
	max   int64
	proto Protocol
	st    state

	body      []byte
	bodyless  bool // decided without a body
	rewritten bool // the shell replaced the body (Rewrite): it goes on as the shell set it
	answered  bool // the request headers were answered before the body came
	held      int  // request body messages received while the headers are held: each owed an answer
	trailers  bool // the request's trailers arrived before the decision: owed an answer
}

// NewFlow starts a flow whose request body is bounded by maxBody bytes,
// assuming proto until Configure says otherwise.
func NewFlow(maxBody int64, proto Protocol) *Flow {
	return &Flow{max: maxBody, proto: proto}
}

// Configure sets the protocol the gateway announced (protocol_config on
// its first message).
func (f *Flow) Configure(p Protocol) { f.proto = p }

// Protocol is the protocol in force.
func (f *Flow) Protocol() Protocol { return f.proto }

// Body is the request body received (nil when the request had none).
func (f *Flow) Body() []byte {
	if f.bodyless {
		return nil
	}
	if f.body == nil {
		return []byte{}
	}
	return f.body
}

// Refused reports whether an immediate response ended the exchange.
func (f *Flow) Refused() bool { return f.st == refused }

// Decided reports whether the request went on to an endpoint.
func (f *Flow) Decided() bool { return f.st >= forwarded && f.st != refused }

// Step takes the gateway's next message.
func (f *Flow) Step(ev Event) (Step, error) {
	if f.st == refused {
		return Step{}, nil // the gateway ignores the stream after an immediate response
	}
	if f.proto.RequestBody == GRPC && ev.Kind <= RequestTrailers || f.proto.ResponseBody == GRPC && ev.Kind >= ResponseHeaders {
		return Step{}, fmt.Errorf("the GRPC body send mode is not supported: configure FULL_DUPLEX_STREAMED, STREAMED or BUFFERED")
	}
	switch ev.Kind {
	case RequestHeaders:
		return f.requestHeaders(ev)
	case RequestBody:
		return f.requestBody(ev)
	case RequestTrailers:
		return f.requestTrailers()
	case ResponseHeaders:
		if f.st != forwarded {
			return Step{}, f.outOfOrder(ev.Kind)
		}
		f.st = inResponse
		s := Step{Replies: []Reply{{Kind: ResponseHeaders}}}
		if ev.EndOfStream {
			f.st, s.ResponseEnded = finished, true
		}
		return s, nil
	case ResponseBody:
		if f.st != inResponse {
			return Step{}, f.outOfOrder(ev.Kind)
		}
		r := Reply{Kind: ResponseBody}
		if f.proto.ResponseBody == FullDuplex {
			// The answer goes on only as sent back: chunk for chunk, at once.
			r.Streamed, r.Chunk, r.EndOfStream = true, ev.Data, ev.EndOfStream
		}
		s := Step{Replies: []Reply{r}}
		if ev.EndOfStream {
			f.st, s.ResponseEnded = finished, true
		}
		return s, nil
	case ResponseTrailers:
		if f.st != inResponse {
			return Step{}, f.outOfOrder(ev.Kind)
		}
		f.st = finished
		return Step{Replies: []Reply{{Kind: ResponseTrailers}}, ResponseEnded: true}, nil
	}
	return Step{}, fmt.Errorf("unknown message %v", ev.Kind)
}

func (f *Flow) outOfOrder(k Kind) error {
	where := map[state]string{awaitHeaders: "before the request headers", inBody: "while the request body was arriving",
		deciding: "while the picker was deciding", forwarded: "before the response headers", inResponse: "after the response headers",
		finished: "after the response ended"}[f.st]
	return fmt.Errorf("%v arrived %s", k, where)
}

func (f *Flow) requestHeaders(ev Event) (Step, error) {
	if f.st != awaitHeaders {
		return Step{}, f.outOfOrder(RequestHeaders)
	}
	if ev.EndOfStream || f.proto.RequestBody == None {
		// No body will come (a GET), or the gateway does not send it:
		// decided on the headers alone.
		f.st, f.bodyless = deciding, true
		return Step{Decide: true}, nil
	}
	f.st = inBody
	switch f.proto.RequestBody {
	case Buffered, BufferedPartial:
		// The gateway holds the request until the body's answer, whose
		// header mutation takes effect in this mode: let the headers on.
		f.answered = true
		return Step{Replies: []Reply{{Kind: RequestHeaders, ClearRouteCache: true}}}, nil
	case Streamed:
		if f.proto.BodyWithoutWaiting {
			return Step{}, nil // the body comes anyway: hold the headers until it is whole
		}
		// The gateway waits for this answer before sending any body, and
		// in STREAMED mode a body answer cannot route: ask for the body
		// buffered (honoured where the filter allows mode overrides).
		f.answered = true
		f.proto.RequestBody = Buffered
		return Step{Replies: []Reply{{Kind: RequestHeaders, ModeOverride: Buffered}}}, nil
	}
	return Step{}, nil // FULL_DUPLEX_STREAMED: hold the headers until the body is whole
}

func (f *Flow) requestBody(ev Event) (Step, error) {
	if f.st == forwarded && f.answered {
		// More body after a buffered one was decided on: let it pass.
		return Step{Replies: []Reply{{Kind: RequestBody}}}, nil
	}
	if f.st != inBody {
		return Step{}, f.outOfOrder(RequestBody)
	}
	if int64(len(f.body))+int64(len(ev.Data)) > f.max {
		f.body = nil
		return Step{TooLarge: true}, nil
	}
	if f.body == nil {
		f.body = ev.Data // the gateway's message is the flow's to keep: no copy
	} else {
		f.body = append(f.body, ev.Data...)
	}
	if f.answered {
		// BUFFERED: this message is the body (or as much of it as the
		// gateway buffers).
		f.st = deciding
		return Step{Decide: true}, nil
	}
	f.held++
	if ev.EndOfStream {
		f.st = deciding
		return Step{Decide: true}, nil
	}
	return Step{}, nil
}

func (f *Flow) requestTrailers() (Step, error) {
	switch f.st {
	case inBody:
		// Trailers end the body (FULL_DUPLEX_STREAMED sends them to say so).
		f.trailers = true
		f.st = deciding
		return Step{Decide: true}, nil
	case forwarded:
		return Step{Replies: []Reply{{Kind: RequestTrailers}}}, nil
	}
	return Step{}, f.outOfOrder(RequestTrailers)
}

// Rewrite replaces the request body the gateway sent on with body (the
// tenant's cache_salt set in it), before Route: the body goes upstream
// as rewritten in every mode, its content-length set to match.
func (f *Flow) Rewrite(body []byte) error {
	if f.st != deciding || f.bodyless {
		return fmt.Errorf("a body rewrite %s", map[bool]string{true: "of a request without a body", false: "outside the decision"}[f.bodyless])
	}
	f.body, f.rewritten = body, true
	return nil
}

// Route sends the request on to route (the destination list) and returns
// the answers owed: the header mutation where it takes effect, then the
// body as the mode wants it.
func (f *Flow) Route(route string) ([]Reply, error) {
	if f.st != deciding {
		return nil, fmt.Errorf("a route was given %s", map[bool]string{true: "after an immediate response", false: "before the request was whole"}[f.st == refused])
	}
	f.st = forwarded
	var out []Reply
	switch {
	case f.bodyless:
		out = append(out, Reply{Kind: RequestHeaders, Route: route, ClearRouteCache: true})
	case f.answered:
		r := Reply{Kind: RequestBody, Route: route, ClearRouteCache: true}
		if f.rewritten { // the headers are held until this answer: its content-length takes effect
			r.Replace, r.Chunk, r.ContentLength = true, f.body, len(f.body)
		}
		out = append(out, r)
	case f.proto.RequestBody == FullDuplex:
		out = append(out, Reply{Kind: RequestHeaders, Route: route, ClearRouteCache: true, ContentLength: len(f.body)})
		// The body goes upstream only as sent back.
		for i := 0; i < len(f.body) || i == 0; i += ChunkBytes {
			end := min(i+ChunkBytes, len(f.body))
			out = append(out, Reply{Kind: RequestBody, Streamed: true, Chunk: f.body[i:end], EndOfStream: end == len(f.body) && !f.trailers})
		}
	default: // STREAMED, the body sent without waiting: one answer per message, in order
		h := Reply{Kind: RequestHeaders, Route: route, ClearRouteCache: true}
		if f.rewritten {
			h.ContentLength = len(f.body)
		}
		out = append(out, h)
		for i := range f.held {
			r := Reply{Kind: RequestBody}
			if f.rewritten {
				// The whole rewritten body in place of the first message,
				// the others cleared.
				r.Replace = true
				if i == 0 {
					r.Chunk = f.body
				}
			}
			out = append(out, r)
		}
	}
	if f.trailers {
		out = append(out, Reply{Kind: RequestTrailers})
	}
	f.held, f.trailers = 0, false
	return out, nil
}

// Refuse answers the request with an immediate response (status, body)
// instead; nothing more is answered on the stream.
func (f *Flow) Refuse(status int, body []byte) ([]Reply, error) {
	if f.st != deciding && f.st != inBody {
		return nil, fmt.Errorf("a refusal was given %s", map[bool]string{true: "twice", false: "after the request went on"}[f.st == refused])
	}
	f.st, f.body = refused, nil
	return []Reply{{Kind: Immediate, Status: status, Body: body}}, nil
}
