package cmdutil

import "testing"

func TestListValueReplacesTheDefaultThenAppends(t *testing.T) {
	list := []string{"http://127.0.0.1:2379"}
	v := &listValue{p: &list}
	for _, s := range []string{"http://a:1, http://b:2", "http://c:3", " ,"} {
		if err := v.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	if got := v.String(); got != "http://a:1,http://b:2,http://c:3" {
		t.Fatalf("got %q", got)
	}
}

func TestFloat32Value(t *testing.T) {
	var f float32
	v := (*float32Value)(&f)
	if err := v.Set("12.5"); err != nil || f != 12.5 {
		t.Fatalf("Set(12.5): %v, %v", f, err)
	}
	if err := v.Set("fast"); err == nil {
		t.Fatal("Set(fast) succeeded")
	}
}
