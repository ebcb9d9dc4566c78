package timeline

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// Options are the timeline settings every volplane service shares.
type Options struct {
	// Off records nothing (--timeline=false): no store, no exporter; the
	// timeline API answers that it is off. For measuring what the
	// timeline costs, and for an operator who wants none.
	Off bool
	// Claims bounds how many claims the store keeps spans for
	// (--timeline-claims); 0 means DefaultClaims.
	Claims int
	// SpansPerClaim bounds the spans kept per claim
	// (--timeline-spans-per-claim); 0 means DefaultSpansPerClaim.
	SpansPerClaim int
	// OTLPEndpoint is the OpenTelemetry collector that gets every span over
	// OTLP/gRPC (--otlp-endpoint): http://host:port for plaintext,
	// https://host:port for TLS with the system's roots. Empty: no
	// exporter is created and nothing is exported.
	OTLPEndpoint string
}

// onFlag is --timeline: the negation of Options.Off, so that the zero
// Options record.
type onFlag bool

func (f *onFlag) String() string { return strconv.FormatBool(!bool(*f)) }

func (f *onFlag) Set(s string) error {
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is not true or false", s)
	}
	*f = onFlag(!on)
	return nil
}

func (f *onFlag) Type() string { return "bool" }

// AddFlags registers the options' flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.Var((*onFlag)(&o.Off), "timeline", "record each claim's steps (served by the timeline API, exported with --otlp-endpoint); false records nothing")
	fs.Lookup("timeline").NoOptDefVal = "true"
	fs.IntVar(&o.Claims, "timeline-claims", DefaultClaims, "claims whose timeline (the steps taken for them) this service keeps in memory; the least recently recorded is dropped first")
	fs.IntVar(&o.SpansPerClaim, "timeline-spans-per-claim", DefaultSpansPerClaim, "steps kept per claim in its timeline; the oldest is dropped first")
	fs.StringVar(&o.OTLPEndpoint, "otlp-endpoint", "", "OpenTelemetry collector to export the timeline's spans to over OTLP/gRPC (http://host:4317 plaintext, https://host:4317 TLS); empty exports nothing")
}

// Validate checks the options, each error naming its flag.
func (o *Options) Validate() []error {
	var errs []error
	if o.Claims < 0 || o.Claims > MaxClaims {
		errs = append(errs, fmt.Errorf("timeline claims must be 0 (the default %d) to %d, got %d (--timeline-claims)", DefaultClaims, MaxClaims, o.Claims))
	}
	if o.SpansPerClaim < 0 || o.SpansPerClaim > MaxSpansPerClaim {
		errs = append(errs, fmt.Errorf("timeline spans per claim must be 0 (the default %d) to %d, got %d (--timeline-spans-per-claim)", DefaultSpansPerClaim, MaxSpansPerClaim, o.SpansPerClaim))
	}
	if o.Off && o.OTLPEndpoint != "" {
		errs = append(errs, errors.New("--otlp-endpoint exports the timeline's spans: it does not go with --timeline=false"))
	}
	if o.OTLPEndpoint != "" {
		if err := checkEndpoint(o.OTLPEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("%w (--otlp-endpoint)", err))
		}
	}
	return errs
}

func checkEndpoint(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("OTLP endpoint %q is not http://host:port or https://host:port", s)
	}
	return nil
}

// Open makes the store of service's replica member (nil, which records
// nothing, when the timeline is off): with an OTLP
// endpoint, also a tracer provider that batches spans to it (service.name
// service, service.instance.id member). The returned shutdown flushes and
// stops the exporter (a no-op without one).
func (o Options) Open(ctx context.Context, service, member string) (*Store, func(context.Context) error, error) {
	if errs := o.Validate(); len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	if o.Off {
		return nil, func(context.Context) error { return nil }, nil
	}
	if o.OTLPEndpoint == "" {
		return New(o.Claims, o.SpansPerClaim, nil), func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(o.OTLPEndpoint))
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP exporter to %s: %w", o.OTLPEndpoint, err)
	}
	res := resource.NewSchemaless(semconv.ServiceName("volplane-"+service), semconv.ServiceInstanceID(member))
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res),
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)))
	shutdown := func(ctx context.Context) error { return tp.Shutdown(ctx) }
	return New(o.Claims, o.SpansPerClaim, tp.Tracer("github.com/volplane/volplane/pkg/timeline")), shutdown, nil
}
