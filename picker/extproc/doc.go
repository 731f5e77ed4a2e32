// Package extproc is the message flow of kvroute's endpoint picker: the
// Gateway API Inference Extension's endpoint picker protocol (v1.0,
// InferencePool inference.networking.k8s.io/v1) over Envoy's ext_proc
// (envoy.service.ext_proc.v3.ExternalProcessor), as GIE's own picker
// speaks it. docs/gateway-epp.md describes the behaviour for operators.
//
// Contract:
//   - Pure: Flow takes the gateway's messages one at a time (Step) and
//     says what to answer and when; the shell (package picker, extproc.go)
//     owns the gRPC stream, translates messages, decides with the Router
//     and calls Route or Refuse. No I/O, clocks, randomness or logging.
//   - Per body send mode, for the request (the picker must see the body
//     to route, since the model and the prompt are in it):
//   - FULL_DUPLEX_STREAMED (what GIE's picker and Istio, kgateway and
//     Envoy Gateway use): the request headers are held, the body
//     chunks accumulate unanswered until end_of_stream (or the request
//     trailers); then the headers answer with the destination, the
//     content-length of the body and clear_route_cache, and the body
//     goes back as streamed mutations of at most ChunkBytes, the last
//     with end_of_stream (unless trailers ended it: then a trailers
//     answer follows).
//   - BUFFERED and BUFFERED_PARTIAL: the headers are answered at once
//     (clear_route_cache), the one body message is decided on and its
//     answer carries the destination as a header mutation (which
//     takes effect in this mode), the body unchanged.
//   - STREAMED with send_body_without_waiting_for_header_response: the
//     headers are held until the body is whole; then the headers answer
//     with the destination, and each body message gets its answer,
//     unchanged, in order.
//   - STREAMED where the gateway waits for the header answer (Envoy's
//     default): a body answer cannot route in this mode, so the headers
//     answer with a mode_override to BUFFERED (the filter must allow
//     mode overrides) and the body is then handled as buffered.
//   - A request without a body (headers with end_of_stream, or request
//     body mode NONE) is decided on the headers alone.
//   - A body the shell rewrote (Rewrite, before Route: the tenant's
//     cache_salt) goes on as rewritten in every mode, its content-length
//     set: streamed back in FULL_DUPLEX_STREAMED; a body mutation in
//     place of the buffered body (and content-length on that answer) in
//     BUFFERED and BUFFERED_PARTIAL; in STREAMED, content-length on the
//     held headers' answer, the whole body in place of the first held
//     message and the others cleared. Unrewritten, bodies go on unchanged.
//   - The response: the headers are answered unchanged; body chunks are
//     sent back as they come in FULL_DUPLEX_STREAMED (the gateway passes
//     on only what comes back), answered unchanged otherwise; the answer
//     ends with its last chunk, its trailers, or headers with
//     end_of_stream (ResponseEnded).
//   - The mode is what the gateway announces in protocol_config on its
//     first message; without one, Config.Assume both ways.
//   - The request body is bounded (Flow's maxBody: the router's
//     MaxBodyBytes); past it the flow asks for a 413 refusal. An immediate
//     response ends the exchange: later messages get no answer.
//   - Endpoint identity (the shell's gatewayAddr and subset matching): an
//     InferencePool selects pods and names up to 8 targetPorts, each
//     podIP:port an endpoint to the gateway. A kvroute endpoint is the
//     engine URL its sidecar announces (the injected sidecar's
//     --engine-url=http://$(POD_IP):8000; a data-parallel engine's rank r
//     serves on 8000+r, each rank its own endpoint). The gateway's name for
//     it is the URL's host:port — http://10.0.3.7:8001 is 10.0.3.7:8001 —
//     the port defaulting by scheme (80, 443), an IP written canonically,
//     IPv6 in brackets as Envoy writes addresses ([fd00::7]:8000). So a
//     pool for DP 2 pods lists targetPorts 8000 and 8001, and each rank is
//     picked, hinted and reported as its own podIP:port. A subset hint entry
//     ip:port names that endpoint, a bare IP every port of the pod.
//   - The destination (x-gateway-destination-endpoint, header and envoy.lb
//     metadata alike) is the picked endpoint, then Config.Fallbacks more in
//     the order the same decision ranks them without those listed before.
//   - A message out of order (body before headers, a second request,
//     response before the decision) is an error for the shell to end the
//     stream with; nothing panics on hostile input.
package extproc
