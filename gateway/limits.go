package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/volplane/volplane/pkg/shape"
)

// Defaults of HTTPOptions.
const (
	DefaultMaxRequestBytes   = 1 << 20
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10

	// The shape of a body (pkg/shape): generous for any Kubernetes
	// object, far below what would cost the gateway or a service much.
	DefaultMaxRequestDepth       = shape.DefaultMaxDepth
	DefaultMaxRequestElements    = shape.DefaultMaxElements
	DefaultMaxRequestStringBytes = shape.DefaultMaxStringBytes
	DefaultMaxRequestKeyBytes    = shape.DefaultMaxKeyBytes
)

// HTTPOptions are the gateway's HTTP server's limits and its serving
// certificate. Zero values mean the defaults above.
type HTTPOptions struct {
	// TLSCertFile and TLSKeyFile are the gateway's serving certificate and
	// key, PEM (--tls-serving-cert-file, --tls-serving-key-file), read
	// again when they change. Both empty serves plain HTTP, where only
	// bearer tokens authenticate.
	TLSCertFile, TLSKeyFile string
	// MaxRequestBytes bounds a request body (--max-request-bytes); a
	// larger one is refused with 413, read no further than the limit.
	MaxRequestBytes int64
	// ReadHeaderTimeout bounds reading a request's headers
	// (--read-header-timeout).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included
	// (--read-timeout), so a client sending slowly cannot hold a
	// connection.
	ReadTimeout time.Duration
	// WriteTimeout bounds a response, from the end of the request's
	// headers (--write-timeout); /v1/watch streams without it.
	WriteTimeout time.Duration
	// IdleTimeout bounds how long a kept-alive connection waits for the
	// next request (--idle-timeout).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (--max-header-bytes).
	MaxHeaderBytes int
	// MaxRequestDepth, MaxRequestElements, MaxRequestStringBytes and
	// MaxRequestKeyBytes bound the shape of a JSON or YAML body
	// (--max-request-depth, --max-request-elements,
	// --max-request-string-bytes, --max-request-key-bytes): how deep it
	// nests, how many values it holds (YAML aliases expanded), how long a
	// string or an object key is. A body beyond one is refused with 400
	// naming the flag, before it is decoded.
	MaxRequestDepth, MaxRequestElements, MaxRequestStringBytes, MaxRequestKeyBytes int
}

// shapeLimits are the body shape limits (zero values are defaults there).
func (o *HTTPOptions) shapeLimits() shape.Limits {
	return shape.Limits{MaxDepth: o.MaxRequestDepth, MaxElements: o.MaxRequestElements,
		MaxStringBytes: o.MaxRequestStringBytes, MaxKeyBytes: o.MaxRequestKeyBytes}
}

// defaults fills in the zero values and reports, all at once, the values
// that cannot work (each naming its flag).
func (o *HTTPOptions) defaults() error {
	var errs []error
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		errs = append(errs, errors.New("--tls-serving-cert-file and --tls-serving-key-file go together"))
	}
	set := func(d *time.Duration, def time.Duration, flag string) {
		switch {
		case *d < 0:
			errs = append(errs, fmt.Errorf("%s must not be negative (0 means %s), got %s", flag, def, *d))
		case *d == 0:
			*d = def
		}
	}
	set(&o.ReadHeaderTimeout, DefaultReadHeaderTimeout, "--read-header-timeout")
	set(&o.ReadTimeout, DefaultReadTimeout, "--read-timeout")
	set(&o.WriteTimeout, DefaultWriteTimeout, "--write-timeout")
	set(&o.IdleTimeout, DefaultIdleTimeout, "--idle-timeout")
	switch {
	case o.MaxRequestBytes < 0:
		errs = append(errs, fmt.Errorf("--max-request-bytes must not be negative (0 means %d), got %d", DefaultMaxRequestBytes, o.MaxRequestBytes))
	case o.MaxRequestBytes == 0:
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	switch {
	case o.MaxHeaderBytes < 0:
		errs = append(errs, fmt.Errorf("--max-header-bytes must not be negative (0 means %d), got %d", DefaultMaxHeaderBytes, o.MaxHeaderBytes))
	case o.MaxHeaderBytes == 0:
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return errors.Join(errs...)
}

// server returns the HTTP server for h with the options' limits.
func (o *HTTPOptions) server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		ReadTimeout:       o.ReadTimeout,
		WriteTimeout:      o.WriteTimeout,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    o.MaxHeaderBytes,
	}
}

// checkTarget refuses a path or query that no route could use: invalid
// UTF-8 or control characters (which would otherwise fail deep in gRPC's
// marshaling as an internal error).
func checkTarget(r *http.Request) error {
	if err := checkText("path", r.URL.Path); err != nil {
		return err
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return fmt.Errorf("the query string does not parse: %v", err)
	}
	for k, vs := range q {
		if err := checkText("query parameter name", k); err != nil {
			return err
		}
		for _, v := range vs {
			if err := checkText("query parameter "+truncate(k, 40), v); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkText(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("the %s is not valid UTF-8", what)
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) {
			return fmt.Errorf("the %s contains the control character %U", what, c)
		}
	}
	return nil
}

// limitBody bounds r's body to max bytes and records in st when a read
// hits the limit, so that the error grpc-gateway makes of it becomes a 413.
func limitBody(w http.ResponseWriter, r *http.Request, max int64, st *reqState) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	r.Body = &limitedBody{ReadCloser: http.MaxBytesReader(w, r.Body, max), st: st}
}

type limitedBody struct {
	io.ReadCloser
	st *reqState
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		b.st.bodyTooLarge = true
	}
	return n, err
}
