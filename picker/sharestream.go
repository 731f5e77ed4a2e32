package picker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/picker/inflight"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// The bookings streams between pickers (DESIGN.md §16): each picker
// serves kvroute.v1.Bookings on its gRPC port, streaming its booking
// changes to every picker that follows it, and follows every other
// picker it finds (gossip members of role picker that advertise a gRPC
// address, and --peer-pickers), applying their changes to the bookings
// its decisions count (Router.ApplyBookings).

// shareConfig tunes the streams.
type shareConfig struct {
	flush     time.Duration // a batch of changes goes out this often (--bookings-flush)
	heartbeat time.Duration // an idle stream sends an empty batch this often
	stale     time.Duration // a follower redials a stream silent this long
	buffer    int           // batches queued per follower before it is cut
	backoff   time.Duration // the first wait before dialling again; doubles to maxBackoff
	creds     credentials.TransportCredentials
}

const (
	maxBackoff       = 5 * time.Second
	maxBookingBatch  = 16 << 20 // a batch's bytes, at most (a live batch of JournalLimit adds is ~5 MiB)
	reconcileTick    = time.Second
	shareHeartbeat   = time.Second
	shareStaleAfter  = 5 * time.Second
	shareBuffer      = 1024
	shareFirstBackof = 100 * time.Millisecond
)

// shareHub is a picker's side of the streams: the followers of its
// bookings (subscribers) and the pickers it follows.
type shareHub struct {
	pb.UnimplementedBookingsServer
	r   *Router
	cfg shareConfig
	log *zap.Logger
	id  string // this picker's instance id

	mu        sync.Mutex
	subs      map[*shareSub]struct{}
	followed  map[string]*followed // by address
	static    map[string]bool
	closed    bool
	stopFlush context.CancelFunc
}

// shareSub is one picker following this one.
type shareSub struct {
	ch  chan *pb.BookingBatch
	cut chan struct{} // closed when it falls behind, or when the hub closes
	// stopping says cut was closed because the hub closed (set under
	// h.mu before cut is closed): the follower is told the picker is
	// stopping, not that it fell behind.
	stopping bool
}

// followed is one picker this one follows.
type followed struct {
	addr   string
	cancel context.CancelFunc
	done   chan struct{}

	// under shareHub.mu
	state    string
	instance string
	err      string
	last     time.Time
	lag      float64
	hasLag   bool
}

func newInstanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newShareHub(r *Router, cfg shareConfig, log *zap.Logger) *shareHub {
	h := &shareHub{r: r, cfg: cfg, log: log, id: newInstanceID(), subs: map[*shareSub]struct{}{}, followed: map[string]*followed{}, static: map[string]bool{}}
	r.ShareBookings(true)
	ctx, cancel := context.WithCancel(context.Background())
	h.stopFlush = cancel
	go h.flushLoop(ctx)
	return h
}

// flushLoop sends the journal's changes to the followers every flush.
func (h *shareHub) flushLoop(ctx context.Context) {
	t := time.NewTicker(h.cfg.flush)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.flush()
		}
	}
}

func (h *shareHub) flush() {
	now := h.r.now()
	ops, overflow := h.r.TakeBookings(now)
	if !overflow && len(ops) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var b *pb.BookingBatch
	if overflow {
		b = h.batch(h.r.LiveBookings(), true, now)
	} else {
		b = h.batch(ops, false, now)
	}
	for s := range h.subs {
		h.enqueue(s, b)
	}
}

// enqueue hands s a batch, or cuts s if it is too far behind (h.mu held).
func (h *shareHub) enqueue(s *shareSub, b *pb.BookingBatch) {
	select {
	case s.ch <- b:
		h.r.pm.sent.Add(float64(len(b.Ops)))
	default:
		delete(h.subs, s)
		close(s.cut)
	}
}

// batch is ops as sent at now.
func (h *shareHub) batch(ops []inflight.Op, live bool, now time.Time) *pb.BookingBatch {
	b := &pb.BookingBatch{Picker: h.id, SentUnixNano: now.UnixNano(), Live: live, Ops: make([]*pb.BookingOp, len(ops))}
	for i, op := range ops {
		o := &pb.BookingOp{Kind: pb.BookingOp_Kind(op.Kind), Id: op.ID, Source: op.Source}
		if op.Kind == inflight.OpAdd {
			o.Endpoint, o.UncachedTokens, o.Carried = op.Endpoint, op.Uncached, op.Carried
			o.AgeMicros = max(0, now.Sub(op.At).Microseconds())
			o.PredictedTtftSeconds, o.FirstByte, o.FirstToken = op.Predicted, op.FirstByte, op.FirstToken
		}
		b.Ops[i] = o
	}
	return b
}

// ops is b's operations as received at now: hostile input, so anything
// malformed is dropped (an unknown kind, an add without an endpoint, a
// non-finite or negative figure).
func opsOf(b *pb.BookingBatch, now time.Time, lifetime time.Duration) []inflight.Op {
	out := make([]inflight.Op, 0, len(b.GetOps()))
	for _, o := range b.GetOps() {
		k := inflight.OpKind(o.GetKind())
		if k < inflight.OpAdd || k > inflight.OpDone || len(o.GetEndpoint()) > 2048 || len(o.GetSource()) > 2048 {
			continue
		}
		op := inflight.Op{Kind: k, ID: o.GetId(), Source: o.GetSource()}
		if k == inflight.OpAdd {
			u, p, age := o.GetUncachedTokens(), o.GetPredictedTtftSeconds(), o.GetAgeMicros()
			if o.GetEndpoint() == "" || !(u >= 0 && u < 1e12) || !(p >= 0 && p < 1e6) || age < 0 {
				continue
			}
			age = min(age, lifetime.Microseconds()) // older than the lifetime: not counted anyway
			op.Endpoint, op.Uncached, op.Carried, op.Predicted = o.GetEndpoint(), u, o.GetCarried(), p
			op.At = now.Add(-time.Duration(age) * time.Microsecond)
			op.FirstByte, op.FirstToken = o.GetFirstByte(), o.GetFirstToken()
		}
		out = append(out, op)
	}
	return out
}

// errFollowsItself is the answer to a picker that dialled its own
// address.
const errFollowsItself = "a picker does not follow its own bookings"

// WatchBookings streams this picker's bookings to a follower.
func (h *shareHub) WatchBookings(req *pb.WatchBookingsRequest, stream grpc.ServerStreamingServer[pb.BookingBatch]) error {
	if req.GetFollower() == h.id {
		return status.Error(codes.FailedPrecondition, errFollowsItself)
	}
	s := &shareSub{ch: make(chan *pb.BookingBatch, h.cfg.buffer), cut: make(chan struct{})}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return status.Error(codes.Unavailable, "the picker is stopping")
	}
	// The live bookings and the subscription at once: a change journalled
	// before this goes out in the next flush too, which the follower
	// applies idempotently.
	first := h.batch(h.r.LiveBookings(), true, h.r.now())
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.subs, s)
		h.mu.Unlock()
	}()
	if err := stream.Send(first); err != nil {
		return err
	}
	h.r.pm.sent.Add(float64(len(first.Ops)))
	hb := time.NewTicker(h.cfg.heartbeat / 2) // an idle stream's batches are at most 1.5 heartbeats apart
	defer hb.Stop()
	last := time.Now()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-s.cut:
			if s.stopping {
				return status.Error(codes.Unavailable, "the picker is stopping")
			}
			return status.Error(codes.ResourceExhausted, "the follower fell behind the bookings stream; dial again")
		case b := <-s.ch:
			if err := stream.Send(b); err != nil {
				return err
			}
			last = time.Now()
		case t := <-hb.C:
			if t.Sub(last) >= h.cfg.heartbeat {
				if err := stream.Send(&pb.BookingBatch{Picker: h.id, SentUnixNano: h.r.now().UnixNano()}); err != nil {
					return err
				}
				last = t
			}
		}
	}
}

// reconcile follows exactly the pickers listed: static (--peer-pickers)
// and those gossip lists alive (role picker, a gRPC address, not this
// node).
func (h *shareHub) reconcile(m *gossip.Members) {
	want := map[string]bool{}
	for a := range h.static {
		want[a] = true
	}
	if m != nil {
		self := m.Name()
		for _, mb := range m.Members() {
			if mb.MetaErr == nil && mb.Meta.Role == gossip.RolePicker && mb.Meta.GRPC != "" && mb.Name != self {
				want[mb.Meta.GRPC] = true
			}
		}
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	var gone []*followed
	for a, f := range h.followed {
		if !want[a] {
			gone = append(gone, f)
			delete(h.followed, a)
		}
	}
	for a := range want {
		if h.followed[a] == nil {
			ctx, cancel := context.WithCancel(context.Background())
			f := &followed{addr: a, cancel: cancel, done: make(chan struct{}), state: debugapi.PeerConnecting}
			h.followed[a] = f
			go h.follow(ctx, f)
		}
	}
	h.mu.Unlock()
	for _, f := range gone {
		f.cancel()
		<-f.done
		h.r.ForgetPicker(f.addr, true)
		h.r.pm.lag.DeleteLabelValues(f.addr)
		h.r.pm.streams.WithLabelValues("gone").Inc()
		h.log.Info("no longer following a picker's bookings: it left", zap.String("picker", f.addr))
	}
}

// reconcileLoop reconciles every second until ctx ends.
func (h *shareHub) reconcileLoop(ctx context.Context, m *gossip.Members) {
	t := time.NewTicker(reconcileTick)
	defer t.Stop()
	h.reconcile(m)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.reconcile(m)
		}
	}
}

// follow keeps a stream to one picker until ctx ends, applying what it
// sends; a failure is logged once per transition and dialled again after
// a backoff.
func (h *shareHub) follow(ctx context.Context, f *followed) {
	defer close(f.done)
	creds := h.cfg.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	wait := h.cfg.backoff
	following := false
	defer func() {
		if following {
			h.r.pm.connected.Dec()
		}
	}()
	for ctx.Err() == nil {
		err := h.stream(ctx, f, creds, func() { wait, following = h.cfg.backoff, true })
		if ctx.Err() != nil {
			return
		}
		if s, ok := status.FromError(err); ok && s.Code() == codes.FailedPrecondition && s.Message() == errFollowsItself {
			h.mu.Lock()
			f.state, f.err = debugapi.PeerSelf, ""
			h.mu.Unlock()
			h.log.Debug("a listed picker address is this picker's own: skipped", zap.String("picker", f.addr))
			<-ctx.Done()
			return
		}
		h.mu.Lock()
		was := f.state
		f.state, f.err = debugapi.PeerConnecting, err.Error()
		h.mu.Unlock()
		cause := "error"
		if s, ok := status.FromError(err); ok && s.Code() == codes.ResourceExhausted {
			cause = "behind"
		}
		h.r.pm.streams.WithLabelValues(cause).Inc()
		if was == debugapi.PeerFollowing {
			following = false
			h.r.pm.connected.Dec()
			h.log.Warn("lost the bookings stream of a picker; its bookings count until their lifetime, and it is dialled again",
				zap.String("picker", f.addr), zap.Error(err))
		} else if f.err != "" && wait == h.cfg.backoff {
			h.log.Warn("cannot follow a picker's bookings; dialling again", zap.String("picker", f.addr), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, maxBackoff)
	}
}

// stream is one stream to f's picker, until it fails or ctx ends;
// connected is called at its first batch.
func (h *shareHub) stream(ctx context.Context, f *followed, creds credentials.TransportCredentials, connected func()) error {
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxBookingBatch)))
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := pb.NewBookingsClient(conn).WatchBookings(sctx, &pb.WatchBookingsRequest{Follower: h.id})
	if err != nil {
		return err
	}
	// A stream silent past stale (no batch, no heartbeat) is dialled again.
	alive := make(chan struct{}, 1)
	go func() {
		t := time.NewTimer(h.cfg.stale)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-alive:
				t.Reset(h.cfg.stale)
			case <-t.C:
				cancel()
				return
			}
		}
	}()
	lifetime := h.r.cfg.PeerBookingLifetime
	for {
		b, err := st.Recv()
		if err != nil {
			if sctx.Err() != nil && ctx.Err() == nil {
				return errors.New("the stream was silent for " + h.cfg.stale.String())
			}
			return err
		}
		select {
		case alive <- struct{}{}:
		default:
		}
		now := h.r.now()
		if b.GetLive() {
			h.r.ForgetPicker(f.addr, false) // what it sent before is replaced
		}
		h.r.ApplyBookings(f.addr, opsOf(b, now, lifetime), now)
		h.mu.Lock()
		first := f.state != debugapi.PeerFollowing
		f.state, f.err, f.instance, f.last = debugapi.PeerFollowing, "", b.GetPicker(), now
		f.lag, f.hasLag = now.Sub(time.Unix(0, b.GetSentUnixNano())).Seconds(), true
		h.mu.Unlock()
		h.r.pm.lag.WithLabelValues(f.addr).Set(f.lag)
		if first {
			connected()
			h.r.pm.connected.Inc()
			h.log.Info("following a picker's bookings", zap.String("picker", f.addr), zap.String("instance", b.GetPicker()))
		}
	}
}

// debug is what /debug/endpoints shows of the streams.
func (h *shareHub) debug(p *debugapi.Picker) {
	if h == nil {
		return
	}
	p.SharesBookings, p.Instance = true, h.id
	held := h.r.PickerBookings()
	now := h.r.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	p.Pickers = []debugapi.PeerPicker{}
	for a, f := range h.followed {
		st := held[a]
		pp := debugapi.PeerPicker{Address: a, State: f.state, Error: f.err, Instance: f.instance, Live: st.Live, Awaiting: st.Awaiting,
			Expired: st.Expired, Received: st.Applied}
		if f.hasLag {
			lag, ago := f.lag, now.Sub(f.last).Seconds()
			pp.LagSeconds, pp.LastBatchSeconds = &lag, &ago
		}
		p.Pickers = append(p.Pickers, pp)
	}
	sort.Slice(p.Pickers, func(i, j int) bool { return p.Pickers[i].Address < p.Pickers[j].Address })
}

// close stops every stream.
func (h *shareHub) close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.closed = true
	fs := make([]*followed, 0, len(h.followed))
	for a, f := range h.followed {
		fs = append(fs, f)
		delete(h.followed, a)
	}
	for s := range h.subs {
		delete(h.subs, s)
		s.stopping = true
		close(s.cut)
	}
	h.mu.Unlock()
	h.stopFlush()
	for _, f := range fs {
		f.cancel()
		<-f.done
	}
}

// startShare starts the bookings streams: the hub and its own gRPC
// server on --peer-listen, advertised in gossip, following the pickers
// listed and those gossip finds until ctx ends.
func (s *Server) startShare(ctx context.Context, cfg *ServerConfig, tf *tlsFiles) error {
	var err error
	if s.peerLn, err = net.Listen("tcp", cfg.PeerListen); err != nil {
		return fmt.Errorf("--peer-listen %s: %w", cfg.PeerListen, err)
	}
	s.share = newShareHub(s.router, shareConfig{flush: cfg.BookingsFlush, heartbeat: shareHeartbeat, stale: shareStaleAfter,
		buffer: shareBuffer, backoff: shareFirstBackof, creds: tf.peers}, s.log.Named("bookings"))
	for _, a := range cfg.PeerPickers {
		s.share.static[a] = true
	}
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(1 << 10), grpc.ChainStreamInterceptor(recoverStream(s.log))}
	if tf.peerServer != nil {
		opts = append(opts, grpc.Creds(tf.peerServer))
	}
	s.peerSrv = grpc.NewServer(opts...)
	pb.RegisterBookingsServer(s.peerSrv, s.share)
	go func() { _ = s.peerSrv.Serve(s.peerLn) }()
	adv := cfg.PeerAdvertise
	if adv == "" {
		adv = s.peerLn.Addr().String()
	}
	if s.members != nil {
		if host, port, _ := net.SplitHostPort(adv); cfg.PeerAdvertise == "" && net.ParseIP(host).IsUnspecified() {
			// Bound on every interface: others dial the gossip address's host.
			ghost, _, err := net.SplitHostPort(s.members.LocalAddr())
			if err != nil {
				return fmt.Errorf("gossip address %q: %w", s.members.LocalAddr(), err)
			}
			adv = net.JoinHostPort(ghost, port)
		}
		if err := s.members.SetMeta(gossip.Meta{Role: gossip.RolePicker, GRPC: adv}); err != nil {
			return fmt.Errorf("gossip metadata: %w", err)
		}
	}
	s.log.Info("sharing bookings with the other pickers", zap.String("peer_advertise", adv), zap.String("instance", s.share.id))
	go s.share.reconcileLoop(ctx, s.members)
	return nil
}

// PeerAddr is the address the bookings streams are served on ("" when
// not shared).
func (s *Server) PeerAddr() string {
	if s.peerLn == nil {
		return ""
	}
	return s.peerLn.Addr().String()
}
