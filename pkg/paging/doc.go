// Package paging pages volplane's list RPCs: a page size with a default
// and a maximum, and an opaque continue token, the same way for every list.
//
// A list is ordered by a key that is unique and stable (a claim's
// "namespace/name", a volume's name, ...). A page holds the first
// page_size items, in key order, whose key comes after the token's, and
// that pass the request's filters; next_page_token is set only when
// another such item exists, so the last page has none, also when the
// items fill whole pages exactly. Continuing by key needs no snapshot: an
// item that exists from the first page to the last is listed exactly
// once, one added or removed meanwhile may or may not be.
//
// A token is opaque to callers. It names the list and a fingerprint of the
// filters it was issued for, so a token passed to another list, or with
// other filters, is refused rather than silently skipping items; a token
// that does not decode, or of another format version (from an older
// volplane: the token has expired), is refused too. Every such refusal is
// the caller's mistake (gRPC InvalidArgument, HTTP 400), and its message
// says to restart the list without a token. Tokens do not expire with
// time: the key they hold stays a valid place to continue from.
//
// A page of an unsorted collection of N items costs O(N log page_size)
// (Pager keeps only the smallest keys it is offered), never a sort of the
// whole collection.
package paging
