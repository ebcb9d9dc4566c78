package paging_test

import (
	"fmt"

	"github.com/volplane/volplane/pkg/paging"
)

func Example() {
	volumes := map[string]string{"pv-c": "Bound", "pv-a": "Available", "pv-d": "Available", "pv-b": "Available"}
	token := ""
	for {
		p, err := paging.New[string]("example.volumes", 2, token, "phase", "Available")
		if err != nil {
			fmt.Println(err) // InvalidArgument: restart the list
			return
		}
		for name, phase := range volumes {
			if phase == "Available" {
				p.Offer(name, name)
			}
		}
		var page []string
		page, token = p.Page()
		fmt.Println(page)
		if token == "" {
			return
		}
	}
	// Output:
	// [pv-a pv-b]
	// [pv-d]
}
