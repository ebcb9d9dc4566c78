// Package shape bounds the shape of a document a caller sends (a request
// body, a JSON object in a gRPC message) before anything expensive is done
// with it: how deep it nests, how many values it holds, how long its
// strings and keys are. Size limits alone do not do this: a 20 KiB body
// can nest 5,000 levels deep, which protobuf then refuses with an internal
// error, and a YAML body of a kilobyte can expand, through anchors and
// aliases, to a billion values (the "billion laughs").
//
// CheckJSON and CheckYAML scan the raw text, once, without building the
// document: JSON token by token, YAML as its node tree, where an alias is
// measured by what it expands to (memoized per anchor, so measuring is
// linear in the text even when the expansion is not). CheckStruct walks a
// google.protobuf.Struct already decoded. Each stops at the first limit
// exceeded and returns an *Error naming the limit and where it was hit.
//
// The limits are inclusive: a document at a limit passes. Depth counts
// objects and arrays (a flat object is depth 1); elements count every
// value, object members and array elements alike (aliases as the values
// they stand for); string and key lengths are in bytes of UTF-8 after
// unescaping.
package shape
