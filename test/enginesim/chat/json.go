package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// UnsupportedError reports valid input that the simulated engine does not
// support, such as multimodal content or built-in tools.
type UnsupportedError struct {
	What string
}

func (e *UnsupportedError) Error() string {
	return e.What + " is not supported by the simulated engine"
}

func unsupported(format string, args ...any) error {
	return &UnsupportedError{What: fmt.Sprintf(format, args...)}
}

// object is a decoded JSON object. Keys match exactly (unlike struct
// decoding in encoding/json, which is case-insensitive).
type object map[string]json.RawMessage

// kind returns the first byte of a JSON value ('{', '[', '"', 'n', ...), or
// 0 if raw is empty.
func kind(raw json.RawMessage) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

func isNull(raw json.RawMessage) bool {
	return kind(raw) == 'n'
}

// checkJSON validates a top-level field value: it must be present and valid.
func checkJSON(raw json.RawMessage, path string) error {
	if kind(raw) == 0 {
		return fmt.Errorf("%s: field required", path)
	}
	if !json.Valid(raw) {
		return fmt.Errorf("%s: invalid JSON", path)
	}
	return nil
}

func decodeObject(raw json.RawMessage, path string) (object, error) {
	if kind(raw) != '{' {
		return nil, fmt.Errorf("%s: must be an object", path)
	}
	var o object
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return o, nil
}

func decodeArray(raw json.RawMessage, path string) ([]json.RawMessage, error) {
	if kind(raw) != '[' {
		return nil, fmt.Errorf("%s: must be an array", path)
	}
	var a []json.RawMessage
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return a, nil
}

func decodeString(raw json.RawMessage, path string) (string, error) {
	if kind(raw) != '"' {
		return "", fmt.Errorf("%s: must be a string", path)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: %v", path, err)
	}
	return s, nil
}

// str returns the optional string field key of o; absent or null gives "".
func (o object) str(key, path string) (string, error) {
	raw, ok := o[key]
	if !ok || isNull(raw) {
		return "", nil
	}
	return decodeString(raw, path+"."+key)
}

// reqStr returns the required string field key of o.
func (o object) reqStr(key, path string) (string, error) {
	raw, ok := o[key]
	if !ok {
		return "", fmt.Errorf("%s.%s: field required", path, key)
	}
	return decodeString(raw, path+"."+key)
}

// reqObject returns the required object field key of o.
func (o object) reqObject(key, path string) (object, error) {
	raw, ok := o[key]
	if !ok {
		return nil, fmt.Errorf("%s.%s: field required", path, key)
	}
	return decodeObject(raw, path+"."+key)
}

// arguments returns the "arguments" field of a function call: a JSON string
// as sent. An object is accepted too and kept as its compacted JSON text;
// absent or null gives "".
func (o object) arguments(path string) (string, error) {
	raw, ok := o["arguments"]
	if !ok || isNull(raw) {
		return "", nil
	}
	if kind(raw) == '{' {
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return "", fmt.Errorf("%s.arguments: %v", path, err)
		}
		return buf.String(), nil
	}
	if kind(raw) != '"' {
		return "", fmt.Errorf("%s.arguments: must be a string", path)
	}
	return decodeString(raw, path+".arguments")
}
