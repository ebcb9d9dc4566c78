package kube

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Bounds on a quantity's text, checked before it is parsed.
const (
	// MaxQuantityLength is the longest quantity accepted, in characters:
	// the API server never writes one longer than about 20 ("-9223372036854775807m"),
	// and a person writes far fewer.
	MaxQuantityLength = 64
	// MaxQuantityExponent bounds a decimal exponent ("1e9", "5E-3"): an
	// int64 needs at most 19 digits, and a nano 9 more.
	MaxQuantityExponent = 64
)

// quantityText is the grammar of a quantity as resource.ParseQuantity
// reads it: a number, then a suffix.
var quantityText = regexp.MustCompile(`^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$`)

// ErrQuantityTooLarge is a quantity beyond what an int64 holds.
var ErrQuantityTooLarge = errors.New("must be at most 8Ei (9223372036854775807) in magnitude: Kubernetes counts bytes in an int64")

// ParseQuantity parses s as the API server does, after refusing from the
// text alone what would take the parser, or whoever compares or prints
// the result, unbounded time: "1E+999999999" parses in microseconds into a
// number that takes minutes to compare or print, "1E-999999999" takes
// minutes to parse. So a text longer than MaxQuantityLength, or a decimal
// exponent beyond ±MaxQuantityExponent, is refused before it is parsed, and
// a quantity beyond an int64 is ErrQuantityTooLarge.
func ParseQuantity(s string) (resource.Quantity, error) {
	if len(s) > MaxQuantityLength {
		return resource.Quantity{}, fmt.Errorf("must be at most %d characters", MaxQuantityLength)
	}
	m := quantityText.FindStringSubmatch(s)
	if m == nil {
		return resource.Quantity{}, resource.ErrFormatWrong
	}
	if suffix := m[2]; len(suffix) > 1 && (suffix[0] == 'e' || suffix[0] == 'E') {
		// "E" alone is exa; "e3", "E+18", "e-9" are decimal exponents.
		if exp, err := strconv.ParseInt(suffix[1:], 10, 64); err == nil && (exp > MaxQuantityExponent || exp < -MaxQuantityExponent) {
			return resource.Quantity{}, fmt.Errorf("the exponent %s is out of range: a quantity's exponent is at most %d in magnitude", truncate(suffix[1:], 20), MaxQuantityExponent)
		} else if err != nil && len(suffix) > 2 {
			return resource.Quantity{}, fmt.Errorf("the exponent %s is out of range: a quantity's exponent is at most %d in magnitude", truncate(suffix[1:], 20), MaxQuantityExponent)
		}
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}, err
	}
	if err := CheckQuantityMagnitude(q); err != nil {
		return resource.Quantity{}, err
	}
	return q, nil
}

// CheckQuantityMagnitude refuses a parsed quantity beyond an int64
// (ErrQuantityTooLarge). It compares an approximation first, which costs
// nothing whatever the quantity, and the exact value only near the bound;
// it is safe on a quantity decoded from anywhere.
func CheckQuantityMagnitude(q resource.Quantity) error {
	f := q.AsApproximateFloat64()
	switch {
	case math.IsNaN(f), math.IsInf(f, 0), math.Abs(f) > 1e19:
		return ErrQuantityTooLarge
	case math.Abs(f) < 9e18:
		return nil
	case q.CmpInt64(math.MaxInt64) > 0, q.CmpInt64(math.MinInt64) < 0:
		return ErrQuantityTooLarge
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
