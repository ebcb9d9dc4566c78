package auth_test

import (
	"fmt"

	"github.com/volplane/volplane/pkg/auth"
)

// A denied request's message names what a role binding must grant.
func ExampleAttributes_Forbidden() {
	u := auth.User{Name: "system:serviceaccount:team-a:ci"}
	a := auth.Attributes{Verb: "delete", Resource: "volumes", Subresource: "backing", Name: "pvc-1234"}
	fmt.Println(a.Forbidden(u, ""))
	// Output: volumes.volplane.io "pvc-1234" is forbidden: User "system:serviceaccount:team-a:ci" cannot delete resource "volumes/backing" in API group "volplane.io" at the cluster scope
}
