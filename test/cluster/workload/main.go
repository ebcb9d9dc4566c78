// Command volplane-workload is the test workload of the cluster tests
// (test/cluster): a static program in an image built FROM scratch
// (ghcr.io/volplane/workload, hack/cluster/images.sh) whose subcommands a
// test runs as a pod's command or through `kubectl exec`, since the image
// has no shell.
//
//	volplane-workload hold [-write PATH=TEXT]...  write each PATH that is missing, then wait for SIGTERM
//	volplane-workload cat PATH...                 print files
//	volplane-workload resolve NAME                print NAME's addresses (the pod's resolver)
//	volplane-workload whoami [-token FILE]        ask the API server who the token is, through the kubernetes Service
//	volplane-workload serve ADDR TEXT             answer every HTTP request on ADDR with TEXT, until SIGTERM
//	volplane-workload get URL                     print the body of an HTTP GET of URL (an error unless 200)
//
// hold logs "wrote PATH" or "kept PATH: TEXT" per file, so that the pod's
// log tells whether the data was there when it started.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: volplane-workload hold|cat|resolve|whoami|serve|get ...")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "hold":
		err = hold(ctx, args)
	case "cat":
		err = cat(args)
	case "resolve":
		err = resolve(ctx, args)
	case "whoami":
		err = whoami(ctx, args)
	case "serve":
		err = serve(ctx, args)
	case "get":
		err = get(ctx, args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "volplane-workload:", err)
		os.Exit(1)
	}
}

type writes []string

func (w *writes) String() string     { return strings.Join(*w, ",") }
func (w *writes) Set(v string) error { *w = append(*w, v); return nil }

// hold writes each missing file, then blocks until the pod is stopped.
func hold(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("hold", flag.ContinueOnError)
	var ws writes
	fs.Var(&ws, "write", "PATH=TEXT: write TEXT to PATH unless PATH exists (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, w := range ws {
		path, text, ok := strings.Cut(w, "=")
		if !ok {
			return fmt.Errorf("-write %q: want PATH=TEXT", w)
		}
		if err := writeOnce(path, text); err != nil {
			return err
		}
	}
	fmt.Println("holding")
	<-ctx.Done()
	fmt.Println("stopped")
	return nil
}

func writeOnce(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Printf("kept %s: %s\n", path, b)
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("wrote %s\n", path)
	return nil
}

func cat(paths []string) error {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		os.Stdout.Write(b)
	}
	return nil
}

func resolve(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: resolve NAME")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, args[0])
	if err != nil {
		return err
	}
	fmt.Println(strings.Join(addrs, "\n"))
	return nil
}

// whoami posts a SelfSubjectReview with the token and prints the user name
// the API server authenticated.
func whoami(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("whoami", flag.ContinueOnError)
	token := fs.String("token", serviceAccountDir+"/token", "the bearer token file")
	caFile := fs.String("ca", serviceAccountDir+"/ca.crt", "the API server's CA")
	server := fs.String("server", "https://kubernetes.default.svc", "the API server's URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tok, err := os.ReadFile(*token)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(*caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("%s: no certificate", *caFile)
	}
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		strings.TrimSuffix(*server, "/")+"/apis/authentication.k8s.io/v1/selfsubjectreviews", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	var review struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(b, &review); err != nil {
		return err
	}
	fmt.Println(review.Status.UserInfo.Username)
	return nil
}

// serve answers every HTTP request on ADDR with TEXT (a pod's node name,
// say, so that a client learns which pod a Service sent it to), until the
// pod is stopped.
func serve(ctx context.Context, args []string) error {
	if len(args) != 2 {
		return errors.New("usage: serve ADDR TEXT")
	}
	text := args[1]
	srv := &http.Server{
		Addr:              args[0],
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, text)
		}),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Println("serving", args[0])
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return srv.Close()
	}
}

// get prints the body of an HTTP GET of URL; a status other than 200 or
// no answer within 10 seconds is an error.
func get(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: get URL")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	os.Stdout.Write(b)
	return nil
}
