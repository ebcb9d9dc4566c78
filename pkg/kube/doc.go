// Package kube holds the Kubernetes helpers volplane's services share: the
// annotations, finalizers and event reasons that must match Kubernetes to the
// letter, a REST config tuned for throughput (protobuf on the wire, no
// client-side throttling unless asked), and the codec that carries objects
// between services. ParseQuantity parses a quantity a caller wrote with
// bounds that keep it cheap (resource.ParseQuantity alone can take minutes
// on "1E-999999999", and comparing or printing "1E+999999999" as long), and
// the codec checks every quantity of an object that way before decoding
// it.
package kube
