package tenant

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

var key = []byte("0123456789abcdef0123456789abcdef")

func TestSalt(t *testing.T) {
	s, err := NewSalter(key)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewSalter([]byte("another key of the same length!!"))
	a, b := s.Salt("acme"), s.Salt("globex")
	switch {
	case a != s.Salt("acme"):
		t.Fatal("one tenant, two salts")
	case a == b:
		t.Fatal("two tenants, one salt")
	case a == other.Salt("acme"):
		t.Fatal("one salt under two keys: the key does not count")
	case !strings.HasPrefix(a, "kvt1-") || len(a) != len("kvt1-")+43:
		t.Fatalf("salt %q", a)
	case strings.Contains(a, "acme"):
		t.Fatalf("the salt %q shows the tenant", a)
	}
	// The key is copied: changing the caller's slice changes nothing.
	k := append([]byte(nil), key...)
	s2, _ := NewSalter(k)
	k[0] ^= 1
	if s2.Salt("acme") != a {
		t.Fatal("the Salter shares the caller's key")
	}
	if _, err := NewSalter(key[:MinKeyBytes-1]); err == nil {
		t.Fatal("a short key taken")
	}
}

func TestCheckTenant(t *testing.T) {
	for name, ok := range map[string]bool{
		"acme": true, "team-7@example.com": true, "租户": true, strings.Repeat("x", MaxTenantBytes): true,
		"": false, " acme": false, "acme\t": false, "a\x00b": false, "a\nb": false, strings.Repeat("x", MaxTenantBytes+1): false,
	} {
		if err := CheckTenant(name); (err == nil) != ok {
			t.Errorf("CheckTenant(%q): %v", name, err)
		}
	}
}

func TestSetSalt(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"no salt", `{"model":"m","messages":[{"role":"user","content":"hi \"there\""}],"max_tokens":5}`},
		{"the client's salt", `{"model":"m","cache_salt":"guess-another-tenant","prompt":"x"}`},
		{"a salt that is not a string", `{"cache_salt":{"a":1},"prompt_token_ids":[1,2,3]}`},
		{"two salts", `{"cache_salt":"mine","model":"m","cache_salt":"another-tenant's"}`},
		{"an escaped key", `{"cache\u005fsalt":"another-tenant's","model":"m"}`},
		{"numbers kept as sent", `{"model":"m","temperature":0.70,"seed":12345678901234567890,"prompt":"x"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := SetSalt([]byte(tc.body), "kvt1-s")
			if err != nil {
				t.Fatal(err)
			}
			var in, got map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tc.body), &in); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			if string(got["cache_salt"]) != `"kvt1-s"` || strings.Count(string(out), "salt") != 1 {
				t.Fatalf("cache_salt %s in %s", got["cache_salt"], out)
			}
			delete(in, "cache_salt")
			delete(got, "cache_salt")
			for k := range in {
				var a, b any
				_ = json.Unmarshal(in[k], &a)
				_ = json.Unmarshal(got[k], &b)
				if !reflect.DeepEqual(a, b) {
					t.Errorf("member %s: %s, sent %s", k, got[k], in[k])
				}
			}
			if len(in) != len(got) {
				t.Errorf("members %v, sent %v", got, in)
			}
			if strings.Contains(tc.body, "12345678901234567890") && !strings.Contains(string(out), "12345678901234567890") {
				t.Errorf("a large integer was rewritten: %s", out)
			}
		})
	}
	for _, bad := range []string{``, `[1,2]`, `"s"`, `{"a":`, `{} {}`} {
		if _, err := SetSalt([]byte(bad), "s"); err == nil {
			t.Errorf("SetSalt(%q) took it", bad)
		}
	}
}

func FuzzSetSalt(f *testing.F) {
	f.Add([]byte(`{"model":"m","cache_salt":"x"}`))
	f.Add([]byte(`{"a":[1,{"b":"c"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := SetSalt(body, "kvt1-z")
		if err != nil {
			return
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			var in map[string]any
			if json.Unmarshal(body, &in) == nil {
				t.Fatalf("valid %q became invalid %q: %v", body, out, err)
			}
			return
		}
		if got["cache_salt"] != "kvt1-z" {
			t.Fatalf("%q → %q", body, out)
		}
	})
}

// TestSetMembers: several members set in one rewrite, each replacing
// every copy the client sent, strings and integers, the rest kept.
func TestSetMembers(t *testing.T) {
	out, err := SetMembers([]byte(`{"priority":"high","model":"m","cache_salt":"a","priority":9}`), String("cache_salt", "kvt1-s"), Int("priority", -3))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if got["cache_salt"] != "kvt1-s" || got["priority"] != float64(-3) || got["model"] != "m" || len(got) != 3 ||
		strings.Count(string(out), "priority") != 1 || strings.Count(string(out), "salt") != 1 {
		t.Fatalf("%s", out)
	}
	if out, err := SetMembers([]byte(`{"a":1}`)); err != nil || string(out) != `{"a":1}` {
		t.Fatalf("no members: %s %v", out, err)
	}
}
