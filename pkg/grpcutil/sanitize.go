package grpcutil

import (
	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Sanitize renders a protobuf message as JSON for logs with every field
// marked secret replaced by "***": fields with the debug_redact option, and
// fields with the CSI spec's csi_secret option (its secrets maps). Anything
// that is not a protobuf message is rendered as "<non-proto>".
func Sanitize(m any) string {
	msg, ok := m.(proto.Message)
	if !ok {
		return "<non-proto>"
	}
	c := proto.Clone(msg)
	redact(c.ProtoReflect())
	b, err := protojson.MarshalOptions{EmitUnpopulated: false}.Marshal(c)
	if err != nil {
		return "<unprintable>"
	}
	return string(b)
}

func redact(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if isSecret(fd) {
			switch {
			case fd.IsMap():
				mp := m.Mutable(fd).Map()
				mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
					if fd.MapValue().Kind() == protoreflect.StringKind {
						mp.Set(k, protoreflect.ValueOfString("***"))
					}
					return true
				})
			case fd.Kind() == protoreflect.StringKind && !fd.IsList():
				m.Set(fd, protoreflect.ValueOfString("***"))
			default:
				m.Clear(fd)
			}
			return true
		}
		switch {
		case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				redact(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Kind() == protoreflect.MessageKind:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				redact(mv.Message())
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Kind() == protoreflect.MessageKind:
			redact(v.Message())
		}
		return true
	})
}

func isSecret(fd protoreflect.FieldDescriptor) bool {
	if opts, ok := fd.Options().(interface{ GetDebugRedact() bool }); ok && opts.GetDebugRedact() {
		return true
	}
	// CSI's secrets maps carry the spec's csi_secret field option.
	secret, _ := proto.GetExtension(fd.Options(), csi.E_CsiSecret).(bool)
	return secret
}
