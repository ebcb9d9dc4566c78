package paging

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// browse pages through keys (offered in a shuffled order) with keep as
// the filter, and returns the pages.
func browse(t *testing.T, keys []string, size int32, keep func(string) bool, filters ...string) [][]string {
	t.Helper()
	var pages [][]string
	tok := ""
	for range len(keys) + 2 {
		p, err := New[string]("test.items", size, tok, filters...)
		if err != nil {
			t.Fatalf("page %d: %v", len(pages), err)
		}
		shuffled := slices.Clone(keys)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		for _, k := range shuffled {
			if keep == nil || keep(k) {
				p.Offer(k, k)
			}
		}
		items, next := p.Page()
		pages = append(pages, items)
		if next == "" {
			return pages
		}
		tok = next
	}
	t.Fatal("the list never ended")
	return nil
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("ns/item-%04d", i)
	}
	return out
}

func TestPages(t *testing.T) {
	even := func(k string) bool { return (k[len(k)-1]-'0')%2 == 0 }
	for name, tc := range map[string]struct {
		keys  []string
		size  int32
		keep  func(string) bool
		sizes []int
	}{
		"empty":                              {nil, 10, nil, []int{0}},
		"one short page":                     {names(3), 10, nil, []int{3}},
		"exact multiple: no empty last page": {names(20), 10, nil, []int{10, 10}},
		"remainder":                          {names(21), 10, nil, []int{10, 10, 1}},
		"default size":                       {names(1201), 0, nil, []int{500, 500, 201}},
		"page of one":                        {names(3), 1, nil, []int{1, 1, 1}},
		"filtered":                           {names(40), 10, even, []int{10, 10}},
		"filter keeps none":                  {names(40), 10, func(string) bool { return false }, []int{0}},
	} {
		t.Run(name, func(t *testing.T) {
			pages := browse(t, tc.keys, tc.size, tc.keep)
			var sizes []int
			var all []string
			for _, p := range pages {
				sizes = append(sizes, len(p))
				all = append(all, p...)
			}
			if !slices.Equal(sizes, tc.sizes) {
				t.Errorf("page sizes %v, want %v", sizes, tc.sizes)
			}
			var want []string
			for _, k := range tc.keys {
				if tc.keep == nil || tc.keep(k) {
					want = append(want, k)
				}
			}
			if !slices.Equal(all, want) {
				t.Errorf("listed %v, want each kept key once in order: %v", all, want)
			}
		})
	}
}

// A key removed after its page and one added behind the cursor do not
// disturb the rest: what exists throughout is listed exactly once.
func TestPagesOfAChangingList(t *testing.T) {
	keys := names(30)
	p, _ := New[string]("test.items", 10, "")
	for _, k := range keys {
		p.Offer(k, k)
	}
	first, tok := p.Page()
	keys = append(slices.Delete(keys, 0, 5), "ns/item-0000a", "ns/zzz")
	var rest []string
	for tok != "" {
		p, err := New[string]("test.items", 10, tok)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			p.Offer(k, k)
		}
		var items []string
		items, tok = p.Page()
		rest = append(rest, items...)
	}
	if len(first) != 10 || rest[0] != "ns/item-0010" || rest[len(rest)-1] != "ns/zzz" || len(rest) != 21 {
		t.Fatalf("first %v, then %v", first, rest)
	}
}

func TestTokens(t *testing.T) {
	p, _ := New[string]("test.items", 1, "", "namespace", "a", "phase", "Bound")
	p.Offer("a/1", "a/1")
	p.Offer("a/2", "a/2")
	_, tok := p.Page()
	if tok == "" || strings.Contains(tok, "a/1") {
		t.Fatalf("token %q: want an opaque token", tok)
	}
	forge := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for name, tc := range map[string]struct {
		list    string
		tok     string
		filters []string
		want    string // "" accepts the token
	}{
		"same list, same filters":       {"test.items", tok, []string{"namespace", "a", "phase", "Bound"}, ""},
		"filters in another order":      {"test.items", tok, []string{"phase", "Bound", "namespace", "a", "class", ""}, ""},
		"another list":                  {"test.others", tok, []string{"namespace", "a", "phase", "Bound"}, "issued by another list (test.items), not test.others: restart the list"},
		"other filters":                 {"test.items", tok, []string{"namespace", "b", "phase", "Bound"}, "issued for other filters"},
		"a filter dropped":              {"test.items", tok, []string{"namespace", "a"}, "issued for other filters"},
		"not base64":                    {"test.items", "%%%", nil, "not a token this API issued"},
		"not JSON":                      {"test.items", forge("ns/name"), nil, "not a token this API issued"},
		"a raw key (an older binder's)": {"test.items", "ns/item-0001", nil, "not a token this API issued"},
		"no key":                        {"test.items", forge(`{"v":1,"l":"test.items","f":"x"}`), nil, "not a token this API issued"},
		"another version (expired)":     {"test.items", forge(`{"v":2,"l":"test.items","f":"x","k":"a"}`), nil, "has expired"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New[string](tc.list, 1, tc.tok, tc.filters...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "":
			case err == nil:
				t.Fatalf("accepted, want %q", tc.want)
			case !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "restart the list without page_token"):
				t.Fatalf("error %q: want ErrInvalid saying %q and to restart the list", err, tc.want)
			}
		})
	}
}

func TestSize(t *testing.T) {
	for _, tc := range []struct {
		in   int32
		want int
		ok   bool
	}{{0, DefaultSize, true}, {1, 1, true}, {MaxSize, MaxSize, true}, {-1, 0, false}, {MaxSize + 1, 0, false}} {
		got, err := Size(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Size(%d) = %d, %v", tc.in, got, err)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("Size(%d): %v does not wrap ErrInvalid", tc.in, err)
		}
	}
}

func TestKeyOrdersAsTuples(t *testing.T) {
	// "a" < "a-b" as strings, but ("a", "z") must sort before ("a-b", "a").
	if !(Key("a", "z") < Key("a-b", "a")) {
		t.Fatal("Key does not order as tuples")
	}
}
