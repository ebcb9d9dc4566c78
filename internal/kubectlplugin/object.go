package kubectlplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// object is a JSON object that keeps its fields in the order the gateway
// sent them (protojson writes them in field order), so that generic output
// reads like the API. Values are nil, bool, json.Number, string, []any or
// *object.
type object struct {
	keys []string
	m    map[string]any
}

func newObject() *object { return &object{m: map[string]any{}} }

func (o *object) set(k string, v any) {
	if _, ok := o.m[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.m[k] = v
}

func (o *object) del(k string) {
	if _, ok := o.m[k]; !ok {
		return
	}
	delete(o.m, k)
	for i, x := range o.keys {
		if x == k {
			o.keys = append(o.keys[:i:i], o.keys[i+1:]...)
			break
		}
	}
}

func (o *object) get(k string) any {
	if o == nil {
		return nil
	}
	return o.m[k]
}

// str is a field as text: a string, a number or a bool; "" otherwise.
func (o *object) str(k string) string {
	switch v := o.get(k).(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	case bool:
		return fmt.Sprint(v)
	}
	return ""
}

// int is a numeric field (protojson writes 64-bit integers as strings).
func (o *object) int(k string) int64 {
	var n json.Number
	switch v := o.get(k).(type) {
	case json.Number:
		n = v
	case string:
		n = json.Number(v)
	default:
		return 0
	}
	i, err := n.Int64()
	if err != nil {
		return 0
	}
	return i
}

func (o *object) bool(k string) bool { b, _ := o.get(k).(bool); return b }

func (o *object) obj(k string) *object { v, _ := o.get(k).(*object); return v }

func (o *object) list(k string) []any { v, _ := o.get(k).([]any); return v }

// strs is a list of strings.
func (o *object) strs(k string) []string {
	var out []string
	for _, v := range o.list(k) {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// time is an RFC 3339 timestamp field; zero when absent.
func (o *object) time(k string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, o.str(k))
	if err != nil {
		return time.Time{}
	}
	return t
}

// MarshalJSON writes the fields in their order.
func (o *object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		vb, err := json.Marshal(o.m[k])
		if err != nil {
			return nil, err
		}
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// decodeObject reads one JSON object, keeping its fields' order.
func decodeObject(data []byte) (*object, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON object")
	}
	o, ok := v.(*object)
	if !ok {
		return nil, fmt.Errorf("a JSON object was expected, not %s", strings.TrimSpace(string(data[:min(len(data), 40)])))
	}
	return o, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := newObject()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				o.set(k, v)
			}
			_, err := dec.Token() // '}'
			return o, err
		case '[':
			out := []any{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := dec.Token() // ']'
			return out, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil
	}
}
