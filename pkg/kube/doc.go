// Package kube holds the Kubernetes helpers volplane's services share: the
// annotations, finalizers and event reasons that must match Kubernetes to the
// letter, a REST config tuned for throughput (protobuf on the wire, no
// client-side throttling unless asked), and the codec that carries objects
// between services.
package kube
