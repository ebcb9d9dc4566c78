// Package claimvalidation checks a PersistentVolumeClaim that a caller
// sends, as the API server would check its creation, before volplane asks
// the API server (a dry run) or a CSI driver to do anything with it: so
// that what the API server would refuse is refused here, cheaply, and what
// the API server would choke on never reaches it.
//
// Validate applies the API server's own validation of a claim's creation
// (upstream's pkg/apis/core/validation, rewritten over the v1 types, with
// apimachinery's object metadata and label selector validation): the name
// (or generateName) and namespace, labels, annotations, finalizers and
// owner references; access modes (at least one, known ones, ReadWriteOncePod
// alone); the selector; requests.storage (required, greater than zero);
// storageClassName and volumeAttributesClassName (DNS subdomains);
// volumeMode; dataSource and dataSourceRef (and that they agree).
//
// Quantities get more than upstream's checks, because parsing and printing
// a quantity is where the API server burns: "1E+999999999" parses in
// microseconds into a number whose comparison or printing takes minutes,
// and "1E-999999999" takes that long to parse. kube.ParseQuantity refuses,
// from the text alone, a quantity longer than 64 characters or whose
// decimal exponent is beyond ±64, and, once parsed, one beyond what an
// int64 holds (8Ei, about 9.2e18): a claim of more bytes than that is no
// claim anyone can serve. DecodeJSON checks the text of
// every quantity of a claim's JSON this way before decoding it, as the API
// server decodes a create (case-sensitive, unknown and duplicate fields
// refused).
//
// Errors are the API server's: apierrors' BadRequest for a body that does
// not decode, Invalid with a cause per field for a claim that would not
// validate, so a caller sees the same answer whether volplane or the API
// server refused.
package claimvalidation
