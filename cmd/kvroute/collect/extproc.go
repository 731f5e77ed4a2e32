package collect

import (
	"context"
	"crypto/tls"
	"net"
	"net/netip"
	"net/url"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/verify"
)

// extProcTarget is the address verify dials the endpoint picker at:
// override when given (--ext-proc), else listen with an unspecified host
// (every interface) replaced by the picker's host.
func extProcTarget(listen, picker, override string) string {
	if override != "" {
		return override
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
		if u, err := url.Parse(picker); err == nil && u.Hostname() != "" {
			host = u.Hostname()
		}
	}
	return net.JoinHostPort(host, port)
}

// extProc probes the endpoint picker ep the picker serves (nil: none)
// over grpc.health.v1 and records the answer in f. One serving TLS is
// probed over TLS without checking its certificate (a health probe
// sends nothing); one requiring a client certificate is not probed.
func (c *Collector) extProc(ctx context.Context, ep *debugapi.ExtProc, f *verify.ExtProcFacts) {
	if ep == nil && c.extProcAddr == "" {
		return
	}
	if ep == nil {
		ep = &debugapi.ExtProc{Address: c.extProcAddr}
	}
	f.Listen, f.Address = ep.Address, extProcTarget(ep.Address, c.picker, c.extProcAddr)
	if ep.ClientCert {
		f.NotProbed = "it requires a client certificate (--ext-proc-client-ca), which verify does not present"
		return
	}
	creds := insecure.NewCredentials()
	if ep.TLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // a health probe: nothing is sent that needs the server's identity
	}
	conn, err := grpc.NewClient(f.Address, grpc.WithTransportCredentials(creds))
	if err != nil {
		f.Err = err.Error()
		return
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, c.settle)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: verify.ExtProcService})
	if err != nil {
		f.Err = err.Error()
		return
	}
	f.Status = resp.GetStatus().String()
}
