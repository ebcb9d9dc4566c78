package coord_test

import (
	"fmt"

	"github.com/volplane/volplane/pkg/coord"
)

// Every replica builds the same ring from the members it sees in etcd and
// syncs only the keys it owns.
func ExampleRing() {
	ring := coord.NewRing([]string{"binder-b", "binder-a", "binder-c"})
	owners := map[string]int{}
	for i := range 300 {
		owners[ring.Owner(fmt.Sprintf("pvc/default/claim-%d", i))]++
	}
	fmt.Println(ring.Members(), len(owners))
	fmt.Println(ring.Owner("pvc/default/claim-7") == coord.NewRing([]string{"binder-c", "binder-a", "binder-b"}).Owner("pvc/default/claim-7"))
	// Output:
	// [binder-a binder-b binder-c] 3
	// true
}
