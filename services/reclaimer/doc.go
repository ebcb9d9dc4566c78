// Package reclaimer is volplane's reclaimer service: it carries out a
// Released PersistentVolume's reclaim policy. The binder hands it every
// volume whose claim is gone.
//
// This release records Retain (the volume stays Released with its data,
// as in Kubernetes; an administrator deletes or reuses it) and accepts
// Recycle and Delete as PENDING: carrying them out is the next step of
// the roadmap. Records are kept in memory per volume name and UID; a
// repeated request for the same volume is idempotent.
package reclaimer
