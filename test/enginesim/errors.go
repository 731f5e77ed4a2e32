package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// apiError is an error with its HTTP status.
type apiError struct {
	status int
	msg    string
	param  string
}

func (a *apiError) Error() string { return a.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func asBadRequest(err error) error {
	var a *apiError
	if errors.As(err, &a) {
		return err
	}
	return badRequest("%s", err.Error())
}

func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "BadRequestError"
	}
	return "InternalServerError"
}

// fail writes vLLM's OpenAI error body and counts the failure.
func (e *Engine) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	e.failParam(w, r, &apiError{status: status, msg: msg})
}

func (e *Engine) failParam(w http.ResponseWriter, r *http.Request, a *apiError) {
	e.metrics.httpErrors.WithLabelValues(r.URL.Path, strconv.Itoa(a.status)).Inc()
	var param any
	if a.param != "" {
		param = a.param
	}
	writeJSON(w, a.status, map[string]any{"error": map[string]any{
		"message": a.msg, "type": errorType(a.status), "param": param, "code": a.status,
	}})
}

func (e *Engine) failErr(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		e.streamFailed(r, err) // the client went away: nobody to answer
		return
	}
	var a *apiError
	if errors.As(err, &a) {
		e.failParam(w, r, a)
		return
	}
	var u *chat.UnsupportedError
	if errors.As(err, &u) {
		e.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	e.fail(w, r, http.StatusInternalServerError, err.Error())
}

// streamFailed counts a stream that broke after its headers were sent.
func (e *Engine) streamFailed(r *http.Request, err error) {
	status := http.StatusInternalServerError
	if errors.Is(err, context.Canceled) {
		status = 499 // client closed the request
	}
	e.metrics.httpErrors.WithLabelValues(r.URL.Path, strconv.Itoa(status)).Inc()
	e.log.Debug("stream ended early", zap.String("path", r.URL.Path), zap.Error(err))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
