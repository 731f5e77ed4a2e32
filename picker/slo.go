package picker

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/picker/intake"
)

// SLOHeader carries a request's time-to-first-token target in
// milliseconds: precise routing then chooses, among the endpoints
// predicted within it, the one that keeps the fleet's cache best.
const SLOHeader = "x-kvroute-slo-ttft-ms"

// maxSLO bounds the header's value (one hour).
const maxSLO = time.Hour

// sloOf reads a request's SLOHeader: 0 without one; a 400 when it is not
// one positive number of milliseconds up to an hour.
func sloOf(h http.Header) (time.Duration, error) {
	vs := h.Values(SLOHeader)
	if len(vs) == 0 {
		return 0, nil
	}
	ms, err := strconv.ParseFloat(vs[0], 64)
	if len(vs) > 1 || err != nil || !(ms > 0) || ms > float64(maxSLO/time.Millisecond) {
		return 0, &intake.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: SLOHeader, Code: "invalid_slo",
			Message: fmt.Sprintf("The %s header must be one number of milliseconds, above 0 and at most %d.", SLOHeader, maxSLO/time.Millisecond)}
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}
