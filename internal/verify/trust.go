package verify

import "github.com/kvroute/kvroute/internal/debugapi"

// refusedCheck is Refused's check of rf, with the picker's own sentence
// on why and since when, when it gave one (the trust check's refusals).
func refusedCheck(rf debugapi.Refusal) Check {
	c := Refused(rf.Endpoint, rf.Reason, rf.SummaryParams)
	if rf.Detail != "" {
		c.Detail += ": " + rf.Detail
	}
	if rf.Since != "" {
		c.Detail += " (since " + rf.Since + ")"
	}
	return c
}
