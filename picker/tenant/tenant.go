package tenant

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/valyala/fastjson"
)

// MinKeyBytes is the shortest key a Salter takes.
const MinKeyBytes = 16

// MaxTenantBytes bounds a tenant name.
const MaxTenantBytes = 256

// Salter derives salts under one key.
type Salter struct{ key []byte }

// NewSalter returns a Salter keyed with key (at least MinKeyBytes; the
// key is copied).
func NewSalter(key []byte) (*Salter, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("tenant: a salt key of %d bytes; want at least %d", len(key), MinKeyBytes)
	}
	return &Salter{key: append([]byte(nil), key...)}, nil
}

// saltPrefix marks a derived salt, and versions the derivation.
const saltPrefix = "kvt1-"

// Salt is tenant's cache_salt: "kvt1-" and the URL-safe base64 of
// HMAC-SHA256(key, tenant), 43 characters (256 bits, as vLLM advises for
// a salt).
func (s *Salter) Salt(tenant string) string {
	m := hmac.New(sha256.New, s.key)
	_, _ = m.Write([]byte("kvroute cache_salt\x00"))
	_, _ = m.Write([]byte(tenant))
	return saltPrefix + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckTenant validates a tenant name as a gateway set it: non-empty, at
// most MaxTenantBytes, printable, without surrounding space.
func CheckTenant(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case len(name) > MaxTenantBytes:
		return fmt.Errorf("%d bytes, more than %d", len(name), MaxTenantBytes)
	case strings.TrimSpace(name) != name:
		return errors.New("surrounded by space")
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return errors.New("not printable")
		}
	}
	return nil
}

// SetSalt returns body, a JSON object, with its top-level cache_salt set
// to salt (replacing the client's, every copy of it, or added), every
// other member kept.
func SetSalt(body []byte, salt string) ([]byte, error) {
	return SetMembers(body, String("cache_salt", salt))
}

// Member is a top-level member of a JSON object body to set: Key and its
// Value (String, Int).
type Member struct {
	Key   string
	Value *fastjson.Value
}

// String is the member key with the string value s.
func String(key, s string) Member {
	var a fastjson.Arena
	return Member{Key: key, Value: a.NewString(s)}
}

// Int is the member key with the integer value n.
func Int(key string, n int) Member {
	var a fastjson.Arena
	return Member{Key: key, Value: a.NewNumberInt(n)}
}

// SetMembers returns body, a JSON object, with each of members set at its
// top level, in order (replacing the client's, every copy of it, or
// added), every other member kept: one parse and one encoding, however
// many members.
func SetMembers(body []byte, members ...Member) ([]byte, error) {
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, fmt.Errorf("the body is not JSON: %w", err)
	}
	o, err := v.Object()
	if err != nil {
		return nil, errors.New("the body is not a JSON object")
	}
	grow := 16
	for _, m := range members {
		for o.Get(m.Key) != nil { // every copy, however its key is escaped: an engine may read the last
			o.Del(m.Key)
		}
		o.Set(m.Key, m.Value)
		grow += len(m.Key) + 8
		if s, err := m.Value.StringBytes(); err == nil {
			grow += len(s)
		}
	}
	return v.MarshalTo(make([]byte, 0, len(body)+grow)), nil
}
