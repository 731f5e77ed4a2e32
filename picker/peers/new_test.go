package peers

import "testing"

func TestNew(t *testing.T) {
	for _, name := range append(Names(), ArmNames()...) {
		p, err := New(name)
		if err != nil || p == nil || p.Name() != name {
			t.Errorf("%s: %v %v", name, p, err)
		}
	}
	if p, err := New("llmd"); err == nil || p != nil {
		t.Errorf("an unknown name: %v %v", p, err)
	}
}
