// Package csisidecar is volplane-csi-sidecar, the image that takes
// csi-provisioner's place in a CSI driver's own pod (docs/sidecar.md).
//
// It accepts csi-provisioner v6.3.0's command line (Flags lists every
// flag and what the sidecar does with it: kept, carried to volplane's
// provisioner in the registration, accepted and not needed, or refused
// when set to a value whose behaviour volplane lacks), and then:
//
//   - dials the driver at --csi-address, as csi-provisioner does, and asks
//     its name (GetPluginInfo), waiting with backoff until it answers;
//   - serves the driver's Identity and Controller methods that volplane's
//     provisioner calls (Forwarded) on --volplane-listen, over TLS 1.3 with
//     a client certificate required: it must chain to volplane's CA (the
//     ConfigMap pkg/sidecar.CAConfigMap in --volplane-namespace, read again
//     every minute, or --volplane-ca-file) and name volplane's provisioner
//     (pkg/callers.Provisioner). Everything else is refused. Its serving
//     certificate is generated at start, in memory only;
//   - registers the driver with a pkg/sidecar.Registration Lease pinning
//     that certificate's SHA-256, renewed every pkg/sidecar.RenewInterval
//     and deleted on shutdown; with --leader-election only while it holds
//     csi-provisioner's own leader lock (the lock csi-lib-utils'
//     leaderelection takes for csi-provisioner, same name, namespace and
//     timings), exiting when it loses it, as csi-provisioner does;
//   - serves /healthz, /healthz/leader-election and /metrics on
//     --http-endpoint.
package csisidecar
