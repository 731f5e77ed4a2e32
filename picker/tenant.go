package picker

import (
	"net/http"

	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/tenant"
)

// SetSalter installs the Salter server-side salts are derived with
// (Config.TenantHeader); the server calls it at start and whenever the
// key file changes. Requests in flight keep the one they started with.
func (r *Router) SetSalter(s *tenant.Salter) { r.salter.Store(s) }

// tenantBody applies the server-side tenant salt to a request's body:
// with Config.TenantHeader set and the header present, the body's
// cache_salt becomes the tenant's derived salt (the client's replaced)
// when salted (the bodies vLLM takes a cache_salt in: chat, completions,
// responses, and the decision API's); without the header, a 401 under
// Config.RequireTenant, else the body as sent. Every refusal is in
// OpenAI's error format and counted.
func (r *Router) tenantBody(req *http.Request, body []byte, salted bool) ([]byte, error) {
	m, err := r.tenantMembers(req.Header, salted)
	if err != nil || len(m) == 0 {
		return body, err
	}
	return r.setMembers(body, m...)
}

// tenantMembers are the body members the tenant header h names (the
// tenant's cache_salt, when salted; none without Config.TenantHeader or
// the header), or tenantBody's refusal.
func (r *Router) tenantMembers(h http.Header, salted bool) ([]tenant.Member, error) {
	name := r.cfg.TenantHeader
	if name == "" {
		return nil, nil
	}
	values := h.Values(name)
	switch {
	case len(values) == 0 && r.cfg.RequireTenant:
		r.m.refused.WithLabelValues("tenant_required").Inc()
		return nil, &intake.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "tenant_required",
			Message: "This picker serves authenticated tenants only: the request carries no " + name + " header (the gateway in front sets it)."}
	case len(values) == 0:
		return nil, nil
	case len(values) > 1:
		r.m.refused.WithLabelValues("bad_tenant").Inc()
		return nil, intake.BadRequest("", "invalid_tenant", "The request names its tenant %d times (%s); want once.", len(values), name)
	}
	if err := tenant.CheckTenant(values[0]); err != nil {
		r.m.refused.WithLabelValues("bad_tenant").Inc()
		return nil, intake.BadRequest("", "invalid_tenant", "The %s header is not a tenant name: %v.", name, err)
	}
	if !salted {
		return nil, nil
	}
	s := r.salter.Load()
	if s == nil {
		return nil, &intake.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_salt_key",
			Message: "The picker has no tenant salt key loaded (--salt-key-file)."}
	}
	return []tenant.Member{tenant.String("cache_salt", s.Salt(values[0]))}, nil
}

// setMembers sets members on a JSON object body (tenant.SetMembers); a
// body that is none is a 400, counted.
func (r *Router) setMembers(body []byte, members ...tenant.Member) ([]byte, error) {
	out, err := tenant.SetMembers(body, members...)
	if err != nil {
		r.m.refused.WithLabelValues("bad_request").Inc()
		return nil, intake.BadRequest("", "", "The request body is not a JSON object: %v.", err)
	}
	return out, nil
}
