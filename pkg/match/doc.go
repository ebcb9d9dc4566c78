// Package match holds the rules that decide whether a PersistentVolume can
// serve a PersistentVolumeClaim, and which of many volumes is the best one,
// exactly as Kubernetes' PV controller decides them:
//
//   - only volumes whose access modes contain all of the claim's are
//     considered, grouped by their exact set of access modes, the groups with
//     the fewest modes first;
//   - within a group, a volume pre-bound to the claim wins at once (it still
//     needs enough capacity, the same volume mode and no deletion pending);
//   - otherwise the smallest Available volume of the claim's class, volume
//     attributes class and volume mode, with enough capacity, matching the
//     claim's selector and not being deleted, wins;
//   - a WaitForFirstConsumer claim without a node binds only to a volume
//     pre-bound to it.
//
// Fit.Check applies these rules in one fixed order and names the first one
// a volume breaks (a Rule), and Fit.Before is the order of preference, so
// that the binder's choice and an explanation of it are the same code: the
// binder takes the first volume in Before's order that Check lets through.
package match
