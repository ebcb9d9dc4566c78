package chaos

import "go.uber.org/zap"

// nopLogger keeps the etcd client's reconnection chatter out of the
// report while etcd is down on purpose.
func nopLogger() *zap.Logger { return zap.NewNop() }
