package claimvalidation

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"

	"github.com/volplane/volplane/pkg/kube"
)

// claimKind names a claim in errors, as the API server does.
var claimKind = schema.GroupKind{Kind: "PersistentVolumeClaim"}

// quantityFields are the paths (by exact keys) of a claim's JSON whose
// values are quantities: the members of these objects. A test checks them
// against the type's every resource.Quantity.
var quantityFields = [][]string{
	{"spec", "resources", "requests"},
	{"spec", "resources", "limits"},
	{"status", "capacity"},
	{"status", "allocatedResources"},
}

// DecodeJSON decodes a claim's JSON as the API server decodes the body of
// a create (keys matched case-sensitively, unknown and duplicate fields
// refused), once the text of every quantity in it passed ParseQuantity's
// checks: a quantity is never parsed unbounded. The error is apierrors'
// Invalid (a quantity, naming its field) or BadRequest (the JSON).
func DecodeJSON(data []byte) (*corev1.PersistentVolumeClaim, error) {
	name, errs, err := checkQuantityTexts(data)
	if err != nil {
		return nil, apierrors.NewBadRequest("the claim is not JSON: " + err.Error())
	}
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(claimKind, name, errs)
	}
	c := &corev1.PersistentVolumeClaim{}
	strict, err := kjson.UnmarshalStrict(data, c, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, apierrors.NewBadRequest(`PersistentVolumeClaim in version "v1" cannot be handled as a PersistentVolumeClaim: ` + err.Error())
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return nil, apierrors.NewBadRequest("strict decoding error: " + strings.Join(msgs, ", "))
	}
	return c, nil
}

// Check decodes a claim's JSON (DecodeJSON) and validates it (Validate),
// the error an apierrors Invalid or BadRequest.
func Check(data []byte) (*corev1.PersistentVolumeClaim, error) {
	c, err := DecodeJSON(data)
	if err != nil {
		return nil, err
	}
	if errs := Validate(c); len(errs) > 0 {
		name := c.Name
		if name == "" {
			name = c.GenerateName
		}
		return nil, apierrors.NewInvalid(claimKind, name, errs)
	}
	return c, nil
}

// checkQuantityTexts reads data token by token (without decoding it) and
// checks the text of each value at a quantity path, every occurrence of a
// duplicated key included. It returns the claim's metadata.name for the
// errors, and the JSON's syntax error if any.
func checkQuantityTexts(data []byte) (string, field.ErrorList, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object, wantKey bool
		key             string
	}
	var (
		stack []frame
		name  string
		errs  field.ErrorList
	)
	// keys is the path of the current value, nil inside an array.
	keys := func() []string {
		out := make([]string, 0, len(stack))
		for _, f := range stack {
			if !f.object {
				return nil
			}
			out = append(out, f.key)
		}
		return out
	}
	done := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			if errors.Is(err, io.EOF) && len(stack) == 0 {
				return name, errs, nil
			}
			return "", nil, err
		}
		d, delim := tok.(json.Delim)
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			if delim { // '}'
				stack = stack[:n-1]
				done()
			} else {
				stack[n-1].key, stack[n-1].wantKey = tok.(string), false
			}
		} else if delim && (d == ']') {
			stack = stack[:len(stack)-1]
			done()
		} else if delim {
			stack = append(stack, frame{object: d == '{', wantKey: d == '{'})
		} else {
			path := keys()
			var text string
			switch v := tok.(type) {
			case string:
				text = v
			case json.Number:
				text = v.String()
			}
			if len(path) == 2 && path[0] == "metadata" && path[1] == "name" {
				name = text
			}
			if len(path) > 0 && text != "" {
				for _, qf := range quantityFields {
					if len(path) == len(qf)+1 && slices.Equal(path[:len(qf)], qf) {
						if _, err := kube.ParseQuantity(text); err != nil {
							p := field.NewPath(qf[0], qf[1:]...).Key(path[len(qf)])
							errs = append(errs, field.Invalid(p, truncate(text, kube.MaxQuantityLength), err.Error()))
						}
					}
				}
			}
			done()
		}
		if len(stack) == 0 {
			// The first value is whole: what follows is the decoder's.
			return name, errs, nil
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
