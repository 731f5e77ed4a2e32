package testnet

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// handed are the ports this process's tests were given: a port drawn at
// random is free when drawn, but a test draws several before it binds
// any, so the same one drawn twice would collide (two engines on one
// replay port). The kernel's own record of bound ports cannot see ports
// not yet bound, hence this one, the process's.
var handed = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// take records p … p+n-1 as handed out; false when one of them already
// was (or is not free now).
func take(p, n int) bool {
	handed.Lock()
	defer handed.Unlock()
	for j := 0; j < n; j++ {
		if handed.ports[p+j] || !free(p+j) {
			return false
		}
	}
	for j := 0; j < n; j++ {
		handed.ports[p+j] = true
	}
	return true
}

// FreePort returns a port free on 127.0.0.1 (TCP and UDP) at the time of
// the call, and never returned before in this process. It is drawn at
// random below the kernel's ephemeral range, so the port cannot be handed
// to another socket bound to port 0 (by this or a concurrent test) before
// the caller binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := portRange()
	for i := 0; i < 1000; i++ {
		if p := lo + rand.IntN(hi-lo); take(p, 1) {
			return p
		}
	}
	t.Fatal("no free port on 127.0.0.1")
	return 0
}

// FreePortPair returns a port p such that p and p+1 are free on 127.0.0.1,
// for data-parallel ranks on port+rank.
func FreePortPair(t testing.TB) int {
	t.Helper()
	lo, hi := portRange()
	for i := 0; i < 1000; i++ {
		if p := lo + rand.IntN(hi-lo-1); take(p, 2) {
			return p
		}
	}
	t.Fatal("no two adjacent free ports on 127.0.0.1")
	return 0
}

// FreePortRun returns a port p such that p … p+n-1 are free on 127.0.0.1,
// for processes that take the first free port of a range.
func FreePortRun(t testing.TB, n int) int {
	t.Helper()
	lo, hi := portRange()
	for i := 0; i < 1000; i++ {
		if p := lo + rand.IntN(hi-lo-n+1); take(p, n) {
			return p
		}
	}
	t.Fatalf("no %d adjacent free ports on 127.0.0.1", n)
	return 0
}

// portRange is the span below the ephemeral ports (the kernel's
// ip_local_port_range, default 32768) that tests draw from.
func portRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 2048 {
				hi = n
			}
		}
	}
	return max(1024, hi-20000), hi
}

func free(p int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}
