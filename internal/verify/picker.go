package verify

import "fmt"

// PickerFacts is what verify saw of the picker itself.
type PickerFacts struct {
	// GossipInsecure: the picker's /debug/endpoints says its own gossip
	// runs without a keyring off loopback (--gossip-insecure).
	GossipInsecure bool
	// PublicAdminStatus is the status the picker's public port answered
	// GET /debug/endpoints with; 0 when it did not answer. Only 404 keeps
	// the admin surface off the public port.
	PublicAdminStatus int
	// PublicAdminErr, when set, is why the public port did not answer.
	PublicAdminErr string
}

// JudgePicker checks the picker itself: its gossip is encrypted (or on
// loopback), and its public port does not serve the admin surface.
func JudgePicker(f PickerFacts) []Check {
	gossip := Check{Name: "picker gossip encrypted", OK: true, Detail: "the picker's gossip is encrypted or on loopback"}
	if f.GossipInsecure {
		gossip.OK, gossip.Detail = false, "the picker gossips without a keyring off loopback (--gossip-insecure)"
		gossip.Cause = "anyone who reaches its gossip port can join and advertise endpoints: give every member --gossip-key-file"
	}
	admin := Check{Name: "picker admin private", OK: true, Detail: "the public port answers 404 for /debug/endpoints"}
	switch {
	case f.PublicAdminErr != "":
		admin.OK, admin.Detail = false, "the public port did not answer: "+f.PublicAdminErr
		admin.Cause = "verify reached the admin port but not --picker: check the URL"
	case f.PublicAdminStatus != 404:
		admin.OK, admin.Detail = false, fmt.Sprintf("the public port answers %d for /debug/endpoints", f.PublicAdminStatus)
		admin.Cause = "every pod's address and load is served to clients: run a picker that serves its admin surface on --admin-listen only"
	}
	return []Check{gossip, admin}
}
