package kube

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/api/resource"
)

// A Kubernetes object in protobuf carries each quantity as its text, which
// the generated decoder hands to resource.ParseQuantity: an object a caller
// sends could make that take minutes ("1E-999999999"). checkProtoQuantities
// reads the wire format first, guided by the Go type's protobuf tags, and
// checks the text of every quantity with ParseQuantity's bounds, so that
// decoding an object from a caller is cheap whatever it holds.

var quantityType = reflect.TypeOf(resource.Quantity{})

// protoField is what the wire format of a field holds.
type protoField struct {
	name string
	// quantity: a resource.Quantity; quantities: a map of them
	// (ResourceList); else a message of type msg (nil: nothing to check).
	quantity, quantities bool
	msg                  reflect.Type
}

var protoFields sync.Map // reflect.Type -> map[protowire.Number]protoField

// fieldsOf maps t's protobuf field numbers (from its tags) to what they
// hold, for the fields that may hold a quantity somewhere below.
func fieldsOf(t reflect.Type) map[protowire.Number]protoField {
	if m, ok := protoFields.Load(t); ok {
		return m.(map[protowire.Number]protoField)
	}
	m := map[protowire.Number]protoField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("protobuf")
		parts := strings.Split(tag, ",")
		if len(parts) < 2 || parts[0] != "bytes" {
			continue
		}
		num, err := strconv.Atoi(parts[1])
		if err != nil {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		pf := protoField{name: name}
		switch {
		case ft == quantityType:
			pf.quantity = true
		case ft.Kind() == reflect.Map && ft.Elem() == quantityType:
			pf.quantities = true
		case ft.Kind() == reflect.Struct:
			pf.msg = ft
		default:
			continue
		}
		m[protowire.Number(num)] = pf
	}
	protoFields.Store(t, m)
	return m
}

// checkProtoQuantities checks every quantity in b, the protobuf of a t,
// before it is decoded. What does not parse as protobuf is left to the
// decoder.
func checkProtoQuantities(b []byte, t reflect.Type) error {
	return checkProto(b, t, "", 0)
}

func checkProto(b []byte, t reflect.Type, path string, depth int) error {
	if depth > 64 {
		return nil // no Kubernetes type nests this deep; the decoder decides
	}
	fields := fieldsOf(t)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		f, ok := fields[num]
		if !ok {
			continue
		}
		p := path + "." + f.name
		switch {
		case f.quantity:
			if err := checkProtoQuantity(v, p); err != nil {
				return err
			}
		case f.quantities:
			// A map entry: key 1, value 2.
			key, value := mapEntry(v)
			if err := checkProtoQuantity(value, p+"["+key+"]"); err != nil {
				return err
			}
		case f.msg != nil:
			if err := checkProto(v, f.msg, p, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// mapEntry reads a map entry's key (a string) and value (bytes).
func mapEntry(b []byte) (string, []byte) {
	var key string
	var value []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				break
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			break
		}
		b = b[n:]
		switch num {
		case 1:
			key = string(v)
		case 2:
			value = v
		}
	}
	return key, value
}

// checkProtoQuantity checks a resource.Quantity message: its text is field
// 1 (the last occurrence wins, as when decoding).
func checkProtoQuantity(b []byte, path string) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil
			}
			b = b[n:]
			// Every occurrence is parsed by the decoder: check each.
			if _, err := ParseQuantity(string(v)); err != nil && len(v) > 0 {
				return fmt.Errorf("%s: quantity %q: %w", strings.TrimPrefix(path, "."), truncate(string(v), MaxQuantityLength), err)
			}
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return nil
		}
		b = b[n:]
	}
	return nil
}
