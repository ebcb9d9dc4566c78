// Package crash proves that a crash at any step with side effects leaves
// state the next owner finishes or undoes: each service runs as a real
// process (test/harness/chaos), is made to exit at a named fault point
// (pkg/faultpoint) in the middle of its work, is started again without
// the fault, and the final state is checked with the chaos run's
// invariants.
package crash
