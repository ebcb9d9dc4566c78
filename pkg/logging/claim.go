package logging

import (
	"log/slog"

	corev1 "k8s.io/api/core/v1"
)

// Claim is the attributes that name a claim on a log line: "claim"
// (namespace/name) and "claimUID". It is one inline attribute, so it can
// be given among key/value pairs:
//
//	log.Info("provisioned", logging.Claim(pvc), "volume", name)
func Claim(c *corev1.PersistentVolumeClaim) slog.Attr {
	if c == nil {
		return slog.Group("")
	}
	return ClaimRef(c.Namespace, c.Name, string(c.UID))
}

// ClaimRef is Claim for a claim known by its namespace, name and UID (a
// volume's claimRef, a journal record); an empty UID is left out.
func ClaimRef(namespace, name, uid string) slog.Attr {
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	if uid == "" {
		return slog.Group("", slog.String("claim", key))
	}
	return slog.Group("", slog.String("claim", key), slog.String("claimUID", uid))
}
