package sidecar

import (
	"reflect"
	"testing"
)

// TestEndpointCannotReachSidecar: an endpoint is given what it needs
// (endpointDeps); no field, nor any field of what they point to, leads
// back to the Sidecar that owns it. Functions are opaque: a callback the
// owner gives may close over it without handing it out.
func TestEndpointCannotReachSidecar(t *testing.T) {
	if path, ok := reaches(reflect.TypeOf(endpoint{}), reflect.TypeOf(Sidecar{}), "endpoint", map[reflect.Type]bool{}); ok {
		t.Fatalf("an endpoint reaches its owner through %s", path)
	}
	// The walk finds what it looks for: the Sidecar reaches its endpoints.
	if _, ok := reaches(reflect.TypeOf(Sidecar{}), reflect.TypeOf(endpoint{}), "Sidecar", map[reflect.Type]bool{}); !ok {
		t.Fatal("the walk does not see the Sidecar's endpoints")
	}
}

// reaches reports whether a value of type from holds, through fields,
// pointers, slices, arrays, maps and channels, a value of type to, and
// the path it found.
func reaches(from, to reflect.Type, path string, seen map[reflect.Type]bool) (string, bool) {
	if from == to {
		return path, true
	}
	if seen[from] {
		return "", false
	}
	seen[from] = true
	switch from.Kind() {
	case reflect.Struct:
		for i := range from.NumField() {
			f := from.Field(i)
			if p, ok := reaches(f.Type, to, path+"."+f.Name, seen); ok {
				return p, true
			}
		}
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Chan:
		return reaches(from.Elem(), to, path, seen)
	case reflect.Map:
		if p, ok := reaches(from.Key(), to, path+"[key]", seen); ok {
			return p, true
		}
		return reaches(from.Elem(), to, path+"[]", seen)
	}
	return "", false
}
