package guard

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Kinds of names in requests, validated as the API server validates them.
const (
	// VolumeName: a PersistentVolume's name (a DNS-1123 subdomain).
	VolumeName NameKind = iota
	// ClaimName: a PersistentVolumeClaim's name (a DNS-1123 subdomain).
	ClaimName
	// Namespace: a namespace's name (a DNS-1123 label).
	Namespace
)

// NameKind says which Kubernetes rules a name follows.
type NameKind int

// CheckName returns an error naming field when value is not valid UTF-8 or
// not a valid name of kind, so that a request is refused up front
// (InvalidArgument) instead of reaching the API server. An empty value is
// an error too: callers check optional fields only when set.
func CheckName(field, value string, kind NameKind) error {
	if value == "" {
		return fmt.Errorf("%s is required", field)
	}
	if !utf8.ValidString(value) {
		return fmt.Errorf("%s is not valid UTF-8", field)
	}
	var errs []string
	switch kind {
	case Namespace:
		errs = validation.IsDNS1123Label(value)
	default:
		errs = validation.IsDNS1123Subdomain(value)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s %q is not a valid name: %s", field, value, strings.Join(errs, "; "))
	}
	return nil
}

// CheckText returns an error naming field when value is not valid UTF-8
// (a UID, a message); an empty value is fine.
func CheckText(field, value string) error {
	if !utf8.ValidString(value) {
		return fmt.Errorf("%s is not valid UTF-8", field)
	}
	return nil
}
