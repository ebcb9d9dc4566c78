package watchclient

import (
	"slices"
	"testing"
)

func TestAddresses(t *testing.T) {
	for in, want := range map[string][]string{
		"":                   nil,
		" , ":                nil,
		"a:1":                {"a:1"},
		" a:1 ,b:2,, c:3 ":   {"a:1", "b:2", "c:3"},
		"unix:///run/w.sock": {"unix:///run/w.sock"},
	} {
		if got := Addresses(in); !slices.Equal(got, want) {
			t.Errorf("Addresses(%q) = %q, want %q", in, got, want)
		}
	}
}
