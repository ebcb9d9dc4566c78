// Command volplane-certs makes the TLS Secrets volplane's manifests mount,
// for a cluster without cert-manager (cert-manager and
// deploy/kubernetes/certificates.yaml stay the production choice): a
// services CA, a separate users' CA for the gateway's client certificates,
// and each component's certificate, written as Secrets to standard output:
//
//	volplane-certs --state-dir ~/.volplane-ca | kubectl apply -f -
//
// The CAs stay in --state-dir: run the same command again to renew the
// certificates under the same CAs (the services reload them). `volplane-certs
// user --state-dir DIR --name alice --group sre` issues a REST user's client
// certificate. See docs/certificates.md.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/volplane/volplane/internal/certs"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "volplane-certs:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "user" {
		return user(args[1:])
	}
	var o certs.Options
	fs := flag.NewFlagSet("volplane-certs", flag.ExitOnError)
	fs.StringVar(&o.StateDir, "state-dir", "", "directory that keeps the CAs (made on the first run, reused by the next; keep it safe) (required)")
	fs.StringVar(&o.Namespace, "namespace", certs.DefaultNamespace, "volplane's namespace: the Secrets' and the DNS names'")
	fs.StringVar(&o.ClusterDomain, "cluster-domain", certs.DefaultClusterDomain, "the cluster's DNS domain")
	fs.DurationVar(&o.Validity, "validity", certs.DefaultValidity, "how long the components' certificates are valid; run again before then")
	fs.Func("gateway-host", "a DNS name or IP address users reach the gateway at (repeat for several)", func(s string) error {
		o.GatewayHosts = append(o.GatewayHosts, s)
		return nil
	})
	fs.StringVar(&o.ClientCAFile, "client-ca-file", "", "CA certificate (PEM) of REST users' client certificates, e.g. the API server's client CA; empty: a users' CA in --state-dir")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	secrets, err := certs.Make(o)
	if err != nil {
		return err
	}
	return certs.WriteYAML(os.Stdout, secrets)
}

func user(args []string) error {
	var stateDir, name, outDir string
	var groups []string
	fs := flag.NewFlagSet("volplane-certs user", flag.ExitOnError)
	fs.StringVar(&stateDir, "state-dir", "", "the state directory of volplane-certs, holding the users' CA (required)")
	fs.StringVar(&name, "name", "", "the user's name (the certificate's common name) (required)")
	fs.Func("group", "a group of the user (the certificate's organizations; repeat for several)", func(s string) error {
		groups = append(groups, strings.TrimSpace(s))
		return nil
	})
	fs.StringVar(&outDir, "out-dir", ".", "directory to write <name>.crt and <name>.key into")
	validity := fs.Duration("validity", certs.DefaultValidity, "how long the certificate is valid")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if stateDir == "" || name == "" {
		return fmt.Errorf("user needs --state-dir and --name")
	}
	crt, key, err := certs.User(stateDir, outDir, name, groups, *validity)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s and %s\n", crt, key)
	return nil
}
