package verify

import "fmt"

// Admission is one model group's admission state, as the picker's
// /debug/admission lists it.
type Admission struct {
	Model     string `json:"model"`
	Saturated bool   `json:"saturated"`
	Waiting   int    `json:"waiting"`
}

// JudgeAdmission fails a model whose endpoints are all saturated: its
// requests wait in the picker's queue, or are shed.
func JudgeAdmission(a Admission) Check {
	c := Check{Name: "admission", Endpoint: a.Model, OK: !a.Saturated,
		Detail: fmt.Sprintf("not saturated (%d waiting)", a.Waiting)}
	if a.Saturated {
		c.Detail = fmt.Sprintf("saturated: every routable endpoint is at a limit (waiting, KV usage or prefill tokens); %d requests wait in the picker's queue, later ones are shed with 429 (/debug/admission)", a.Waiting)
	}
	return c
}
