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
	"fmt"
	"os"
	"strings"

	"github.com/volplane/volplane/internal/certs"
	"github.com/volplane/volplane/pkg/cmdutil"
)

const description = `volplane-certs makes the TLS Secrets volplane's manifests mount, for a
cluster without cert-manager: a services CA, a separate users' CA for the gateway's client
certificates, and each component's certificate, written as Secrets to standard output
(volplane-certs --state-dir DIR | kubectl apply -f -). The CAs stay in --state-dir: run the same
command again to renew the certificates under the same CAs. "volplane-certs user" issues a REST
user's client certificate. See docs/certificates.md.`

const userDescription = `volplane-certs user issues a client certificate for a user of volplane's
REST gateway, signed by the users' CA in --state-dir: the user's name is the certificate's
Common Name, its groups the Organizations, as the API server reads client certificates.`

func main() { os.Exit(run(os.Args[1:])) }

// run runs the command line args and returns the exit code.
func run(args []string) int {
	if len(args) > 0 && args[0] == "user" {
		return user(args[1:])
	}
	var o certs.Options
	cmd := cmdutil.NewCommand("volplane-certs", description)
	cmd.Usage = "volplane-certs --state-dir DIR [flags] | kubectl apply -f -\n  volplane-certs user --state-dir DIR --name NAME [--group GROUP]... [flags]"
	fs := cmd.Flags("Certificates")
	fs.StringVar(&o.StateDir, "state-dir", "", "directory that keeps the CAs (made on the first run, reused by the next; keep it safe) (required)")
	fs.StringVar(&o.Namespace, "namespace", certs.DefaultNamespace, "volplane's namespace: the Secrets' and the DNS names'")
	fs.StringVar(&o.ClusterDomain, "cluster-domain", certs.DefaultClusterDomain, "the cluster's DNS domain")
	fs.DurationVar(&o.Validity, "validity", certs.DefaultValidity, "how long the components' certificates are valid; run again before then")
	cmdutil.Func(fs, "gateway-host", "host", "a DNS name or IP address users reach the gateway at (repeat for several)", func(s string) error {
		o.GatewayHosts = append(o.GatewayHosts, s)
		return nil
	})
	fs.StringVar(&o.ClientCAFile, "client-ca-file", "", "CA certificate (PEM) of REST users' client certificates, e.g. the API server's client CA; empty: a users' CA in --state-dir")
	if code, done := cmd.Parse(args); done {
		return code
	}
	if err := cmd.NoArgs(); err != nil {
		return cmd.UsageError(err)
	}
	secrets, err := certs.Make(o)
	if err == nil {
		err = certs.WriteYAML(os.Stdout, secrets)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "volplane-certs:", err)
		return 1
	}
	return 0
}

func user(args []string) int {
	var stateDir, name, outDir string
	var groups []string
	cmd := cmdutil.NewCommand("volplane-certs user", userDescription)
	fs := cmd.Flags("User")
	fs.StringVar(&stateDir, "state-dir", "", "the state directory of volplane-certs, holding the users' CA (required)")
	fs.StringVar(&name, "name", "", "the user's name (the certificate's common name) (required)")
	cmdutil.Func(fs, "group", "group", "a group of the user (the certificate's organizations; repeat for several)", func(s string) error {
		groups = append(groups, strings.TrimSpace(s))
		return nil
	})
	fs.StringVar(&outDir, "out-dir", ".", "directory to write <name>.crt and <name>.key into")
	validity := fs.Duration("validity", certs.DefaultValidity, "how long the certificate is valid")
	if code, done := cmd.Parse(args); done {
		return code
	}
	if err := cmd.NoArgs(); err != nil {
		return cmd.UsageError(err)
	}
	if stateDir == "" || name == "" {
		return cmd.UsageError(fmt.Errorf("--state-dir and --name are required"))
	}
	crt, key, err := certs.User(stateDir, outDir, name, groups, *validity)
	if err != nil {
		fmt.Fprintln(os.Stderr, "volplane-certs user:", err)
		return 1
	}
	fmt.Printf("wrote %s and %s\n", crt, key)
	return 0
}
