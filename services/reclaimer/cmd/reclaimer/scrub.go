package main

import (
	"fmt"
	"os"

	"github.com/volplane/volplane/services/reclaimer"
)

// scrub deletes the contents of the one directory named, as Kubernetes'
// recycler pod's shell command does; non-zero when it cannot.
func scrub(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: reclaimer scrub DIR (deletes everything inside DIR, keeps DIR)")
		return 2
	}
	if err := reclaimer.Scrub(args[0]); err != nil {
		fmt.Fprintln(os.Stderr, "scrub:", err)
		return 1
	}
	fmt.Println("scrubbed", args[0])
	return 0
}
