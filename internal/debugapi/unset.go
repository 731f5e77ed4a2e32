package debugapi

import (
	"reflect"
	"strings"
)

// Unset lists the fields, by JSON path (endpoints[].lag_seconds,
// picker.gossip_insecure), that no element of d sets: none for a
// document that exercises every field. Writers' and readers' tests use it
// to show their fixture covers the whole document, fields added later
// included.
func Unset(d Document) []string {
	var out []string
	v := reflect.ValueOf(d)
	for i := range v.NumField() {
		name := jsonName(v.Type().Field(i))
		switch f := v.Field(i); f.Kind() {
		case reflect.Slice:
			out = append(out, unsetIn(name+"[].", f, f.Len())...)
		default:
			out = append(out, unsetIn(name+".", reflect.Append(reflect.MakeSlice(reflect.SliceOf(f.Type()), 0, 1), f), 1)...)
		}
	}
	return out
}

// unsetIn lists the fields of the structs in list (of length n) that are
// zero in every one of them, each name prefixed.
func unsetIn(prefix string, list reflect.Value, n int) []string {
	var out []string
	t := list.Type().Elem()
	for j := range t.NumField() {
		set := false
		for k := 0; k < n && !set; k++ {
			set = !list.Index(k).Field(j).IsZero()
		}
		if !set {
			out = append(out, prefix+jsonName(t.Field(j)))
		}
	}
	return out
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}
