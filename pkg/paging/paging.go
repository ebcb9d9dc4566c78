package paging

import (
	"container/heap"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

const (
	// DefaultSize is the page size of a request that asks for none.
	DefaultSize = 500
	// MaxSize is the largest page a request may ask for.
	MaxSize = 5000
	// version is the token format; a token of another version has expired.
	version = 1
)

// ErrInvalid is wrapped by every error of this package: the request's page
// size or token is wrong, the caller's mistake.
var ErrInvalid = errors.New("invalid page request")

// restart ends every token error: what the caller does about it.
const restart = "restart the list without page_token"

// Size returns the page size a request's page_size asks for: 0 is
// DefaultSize; a negative size or one over MaxSize is an error.
func Size(n int32) (int, error) {
	switch {
	case n < 0 || n > MaxSize:
		return 0, fmt.Errorf("%w: page_size %d is out of range: use 1 to %d, or 0 for the default %d", ErrInvalid, n, MaxSize, DefaultSize)
	case n == 0:
		return DefaultSize, nil
	}
	return int(n), nil
}

// Cursor encodes and decodes the tokens of one list with one set of
// filters.
type Cursor struct {
	list, filter string
}

// NewCursor is the cursor of list (a name unique among volplane's lists,
// e.g. "binder.claims") with the request's filters given as name, value
// pairs; empty values (no filter) may be given or left out alike.
func NewCursor(list string, filters ...string) Cursor {
	var parts []string
	for i := 0; i+1 < len(filters); i += 2 {
		if filters[i+1] != "" {
			parts = append(parts, filters[i]+"="+filters[i+1])
		}
	}
	slices.Sort(parts)
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return Cursor{list: list, filter: base64.RawURLEncoding.EncodeToString(sum[:9])}
}

// token is what a page token holds, JSON in URL-safe base64.
type token struct {
	V int    `json:"v"`
	L string `json:"l"`
	F string `json:"f"`
	K string `json:"k"`
}

// Token is the token of the page after the one whose last key is key.
func (c Cursor) Token(key string) string {
	b, _ := json.Marshal(token{V: version, L: c.list, F: c.filter, K: key})
	return base64.RawURLEncoding.EncodeToString(b)
}

// After returns the key a page token continues after ("" for no token:
// the first page), or an error saying why the token is refused.
func (c Cursor) After(tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	var t token
	if err == nil {
		err = json.Unmarshal(raw, &t)
	}
	switch {
	case err != nil || t.V == 0 || t.L == "" || t.K == "":
		return "", fmt.Errorf("%w: page_token is not a token this API issued: pass next_page_token exactly as received, or %s", ErrInvalid, restart)
	case t.V != version:
		return "", fmt.Errorf("%w: page_token has expired (it was issued by another version of volplane): %s", ErrInvalid, restart)
	case t.L != c.list:
		return "", fmt.Errorf("%w: page_token was issued by another list (%s), not %s: %s", ErrInvalid, t.L, c.list, restart)
	case t.F != c.filter:
		return "", fmt.Errorf("%w: page_token was issued for other filters: pass the filters of the first page with every page, or %s", ErrInvalid, restart)
	}
	return t.K, nil
}

// Pager builds one page of a list from items offered in any order.
type Pager[T any] struct {
	cur   Cursor
	after string
	size  int
	h     maxHeap[T]
}

// New starts a page of list for a request's page_size and page_token and
// the filters (name, value pairs) it was made with. Its error wraps
// ErrInvalid.
func New[T any](list string, pageSize int32, pageToken string, filters ...string) (*Pager[T], error) {
	size, err := Size(pageSize)
	if err != nil {
		return nil, err
	}
	cur := NewCursor(list, filters...)
	after, err := cur.After(pageToken)
	if err != nil {
		return nil, err
	}
	return &Pager[T]{cur: cur, after: after, size: size}, nil
}

// Want reports whether an item of this key could be on the page (its key
// comes after the token's and before the largest kept so far), so a caller
// can skip building an item that would be dropped.
func (p *Pager[T]) Want(key string) bool {
	if key <= p.after {
		return false
	}
	return len(p.h) <= p.size || key < p.h[0].key
}

// Offer offers an item that passed the request's filters. Keys must be
// unique within a list.
func (p *Pager[T]) Offer(key string, item T) {
	if !p.Want(key) {
		return
	}
	heap.Push(&p.h, entry[T]{key: key, item: item})
	// One more than the page: it tells whether there is a next page.
	if len(p.h) > p.size+1 {
		heap.Pop(&p.h)
	}
}

// Page returns the page's items in key order and the next page's token,
// "" on the last page.
func (p *Pager[T]) Page() ([]T, string) {
	es := []entry[T](p.h)
	slices.SortFunc(es, func(a, b entry[T]) int { return strings.Compare(a.key, b.key) })
	next := ""
	if len(es) > p.size {
		es = es[:p.size]
		next = p.cur.Token(es[len(es)-1].key)
	}
	out := make([]T, len(es))
	for i, e := range es {
		out[i] = e.item
	}
	p.h = nil
	return out, next
}

type entry[T any] struct {
	key  string
	item T
}

// maxHeap keeps the largest key on top, to drop it when the page is full.
type maxHeap[T any] []entry[T]

func (h maxHeap[T]) Len() int           { return len(h) }
func (h maxHeap[T]) Less(i, j int) bool { return h[i].key > h[j].key }
func (h maxHeap[T]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *maxHeap[T]) Push(x any)        { *h = append(*h, x.(entry[T])) }
func (h *maxHeap[T]) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// Key joins the parts of a composite key so that keys order as the tuples
// of their parts do (parts must not hold NUL).
func Key(parts ...string) string { return strings.Join(parts, "\x00") }
