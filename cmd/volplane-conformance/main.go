// Command volplane-conformance checks that an implementation of one of
// volplane's service APIs keeps its contract, as csi-sanity does for CSI
// drivers:
//
//	volplane-conformance provisioner|reclaimer|watcher|binder --address HOST:PORT \
//	  --tls-ca-file ca.crt --tls-cert-file client.crt --tls-key-file client.key \
//	  [--kubeconfig FILE] [--provisioner-name NAME] [--run REGEXP] [--list]
//
// It prints one line per check (PASS, FAIL with why, SKIP with why) and
// exits 1 when a check failed, 2 on bad usage. docs/conformance.md says
// what each check asserts.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"syscall"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/conformance"
	"github.com/volplane/volplane/pkg/kube"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const description = `volplane-conformance checks that an implementation of one of volplane's
service APIs (provisioner, reclaimer, watcher or binder) keeps its contract, as csi-sanity does
for CSI drivers. It prints one line per check (PASS, FAIL with why, SKIP with why) and exits 1
when a check failed, 2 on bad usage. docs/conformance.md says what each check asserts.`

const usage = "volplane-conformance provisioner|reclaimer|watcher|binder --address HOST:PORT [flags]"

func run(args []string, stdout, stderr io.Writer) int {
	var service conformance.Service
	if len(args) > 0 {
		service = conformance.Service(args[0])
	}
	cmd := cmdutil.NewCommand("volplane-conformance "+string(service), description)
	cmd.Usage, cmd.Stdout, cmd.Stderr = usage, stdout, stderr
	if service == "" || conformance.Checks(service) == nil {
		// volplane-conformance --help, --version
		cmd.Name = "volplane-conformance"
		if len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' {
			if code, done := cmd.Parse(args); done {
				return code
			}
		}
		fmt.Fprintln(stderr, "usage: "+usage+"; --help lists the flags")
		return 2
	}
	var cfg conformance.Config
	var kubeconfig, only string
	var list, verbose bool
	fs := cmd.Flags("Conformance")
	fs.StringVar(&cfg.Address, "address", "", "gRPC address of the implementation under test (host:port or unix:///path)")
	fs.StringVar(&cfg.TLS.CAFile, "tls-ca-file", "", "CA (PEM) that signs the implementation's certificate")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert-file", "", "client certificate (PEM) the implementation accepts, as every volplane service requires one; volplane's services allow every RPC to the Common Name volplane-conformance only")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key-file", "", "private key (PEM) of --tls-cert-file")
	fs.BoolVar(&cfg.TLS.InsecurePlaintext, "insecure-plaintext", false, "dial without TLS (an implementation serving plaintext)")
	fs.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster the implementation serves; the checks that need Kubernetes objects create and delete their own namespaces and objects; without it they are skipped")
	fs.StringVar(&cfg.ProvisionerName, "provisioner-name", "", "provisioner: the StorageClass provisioner (driver) to test with, default the first ready one; reclaimer, binder: the provisioner dynamic volumes are made by (enables those checks)")
	fs.StringVar(&cfg.ProvisionerAddress, "provisioner-address", "", "reclaimer: the provisioner the reclaimer deletes through, to make a volume for the Delete check")
	fs.StringVar(&cfg.CSIEndpoint, "csi-endpoint", "", "provisioner, reclaimer: the CSI driver behind the provisioner (unix:///path), to check the backing volumes themselves")
	fs.DurationVar(&cfg.Timeout, "timeout", conformance.DefaultTimeout, "time limit of each check")
	fs.IntVar(&cfg.HistoryWrites, "watcher-history-writes", conformance.DefaultHistoryWrites, "watcher: at most this many writes to push a cursor out of the watcher's history")
	fs.StringVar(&only, "run", "", "run only the checks whose name matches this regular expression")
	fs.BoolVar(&list, "list", false, "list the checks and what each asserts, and exit")
	fs.BoolVarP(&verbose, "v", "v", false, "log each check's progress")
	if code, done := cmd.Parse(args[1:]); done {
		return code
	}
	if err := cmd.NoArgs(); err != nil {
		return cmd.UsageError(err)
	}
	if list {
		for _, c := range conformance.Checks(service) {
			fmt.Fprintf(stdout, "%s\n    %s\n", c.Name, c.Doc)
		}
		return 0
	}
	if only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			fmt.Fprintf(stderr, "--run: %v\n", err)
			return 2
		}
		cfg.Run = re
	}
	if verbose {
		cfg.Logf = func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }
	}
	if kubeconfig != "" {
		c, _, err := kube.NewClientset(kube.ClientOptions{Kubeconfig: kubeconfig, UserAgent: "volplane-conformance"})
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		cfg.Kube = c
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return report(ctx, service, cfg, stdout, stderr)
}

func report(ctx context.Context, service conformance.Service, cfg conformance.Config, stdout, stderr io.Writer) int {
	counts := map[conformance.Outcome]int{}
	_, err := conformance.Run(ctx, service, cfg, func(r conformance.Result) {
		counts[r.Outcome]++
		fmt.Fprintf(stdout, "--- %s: %s (%.2fs)\n", r.Outcome, r.Check, r.Duration.Seconds())
		if r.Message != "" {
			fmt.Fprintf(stdout, "    %s\n", regexp.MustCompile("\n").ReplaceAllString(r.Message, "\n    "))
		}
	})
	if err != nil {
		fmt.Fprintln(stderr, "volplane-conformance:", err)
		return 2
	}
	fmt.Fprintf(stdout, "%s %s: %d passed, %d failed, %d skipped\n", map[bool]string{true: "FAIL", false: "ok"}[counts[conformance.Failed] > 0],
		service, counts[conformance.Passed], counts[conformance.Failed], counts[conformance.Skipped])
	if counts[conformance.Failed] > 0 {
		return 1
	}
	return 0
}
