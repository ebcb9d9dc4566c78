// Command etcd is etcd itself (go.etcd.io/etcd/server/v3's etcdmain), at
// the version go.mod pins, for the etcd image of `make images`. etcd's own
// main module replaces its modules with relative paths, so `go install`
// refuses it; this throwaway module builds the same entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
