// Command gotypes prints, as JSON, the shape encoding/json sees in the Go types whose values the
// control-plane-operator serializes for the ignition path: for every struct, its fields in
// declaration order with their JSON names and options. Run inside a HyperShift checkout:
//
//	mkdir -p hack/gotypes && cp go_types.go hack/gotypes/main.go && go run -mod=vendor ./hack/gotypes > go_types.json
package main

import (
	"encoding/json"
	"os"
	"reflect"
	"sort"
	"strings"

	hyperv1 "github.com/openshift/hypershift/api/hypershift/v1beta1"

	configv1 "github.com/openshift/api/config/v1"
	mcfgv1 "github.com/openshift/api/machineconfiguration/v1"

	corev1 "k8s.io/api/core/v1"
)

type field struct {
	Name      string `json:"name"`
	Type      any    `json:"type"`
	OmitEmpty bool   `json:"omitempty,omitempty"`
	OmitZero  bool   `json:"omitzero,omitempty"`
	Inline    bool   `json:"inline,omitempty"`
	Quoted    bool   `json:"quoted,omitempty"`
}

var (
	marshaler = reflect.TypeOf((*json.Marshaler)(nil)).Elem()
	structs   = map[string][]field{}
)

func id(t reflect.Type) string {
	return t.PkgPath() + "." + t.Name()
}

// ref describes a type: a basic kind's name, {"ptr"|"list"|"map": elem}, {"struct": id} or {"custom": id}.
func ref(t reflect.Type) any {
	if t.Kind() == reflect.Pointer {
		return map[string]any{"ptr": ref(t.Elem())}
	}
	if t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler) {
		return map[string]string{"custom": id(t)}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return map[string]any{"ptr": ref(t.Elem())}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "bytes"
		}
		return map[string]any{"list": ref(t.Elem())}
	case reflect.Array:
		return map[string]any{"list": ref(t.Elem())}
	case reflect.Map:
		return map[string]any{"map": ref(t.Elem())}
	case reflect.Struct:
		walk(t)
		return map[string]string{"struct": id(t)}
	case reflect.Bool, reflect.String:
		return t.Kind().String()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "int"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "uint"
	case reflect.Float32, reflect.Float64:
		return "float"
	case reflect.Interface:
		return "any"
	}
	panic("unsupported kind " + t.String())
}

func walk(t reflect.Type) {
	key := id(t)
	if _, seen := structs[key]; seen {
		return
	}
	structs[key] = nil // recursion guard
	fields := []field{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		parts := strings.Split(tag, ",")
		name, options := parts[0], parts[1:]
		out := field{Name: name, Type: ref(f.Type)}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			out.Inline = true
		} else if name == "" {
			out.Name = f.Name
		}
		for _, option := range options {
			switch option {
			case "omitempty":
				out.OmitEmpty = true
			case "omitzero":
				out.OmitZero = true
			case "string":
				out.Quoted = true
			}
		}
		fields = append(fields, out)
	}
	structs[key] = fields
}

func main() {
	roots := map[string]reflect.Type{
		"ClusterConfiguration": reflect.TypeOf(hyperv1.ClusterConfiguration{}),
		"DNS":                  reflect.TypeOf(configv1.DNS{}),
		"Infrastructure":       reflect.TypeOf(configv1.Infrastructure{}),
		"Network":              reflect.TypeOf(configv1.Network{}),
		"Proxy":                reflect.TypeOf(configv1.Proxy{}),
		"Image":                reflect.TypeOf(configv1.Image{}),
		"APIServer":            reflect.TypeOf(configv1.APIServer{}),
		"ImageDigestMirrorSet": reflect.TypeOf(configv1.ImageDigestMirrorSet{}),
		"ConfigMap":            reflect.TypeOf(corev1.ConfigMap{}),
		"MachineConfig":        reflect.TypeOf(mcfgv1.MachineConfig{}),
		"MachineConfigPool":    reflect.TypeOf(mcfgv1.MachineConfigPool{}),
	}
	rootIDs := map[string]string{}
	for name, t := range roots {
		walk(t)
		rootIDs[name] = id(t)
	}
	// One struct a line, sorted: a regenerated file diffs by the structs that changed.
	rootsJSON, err := json.Marshal(rootIDs)
	if err != nil {
		panic(err)
	}
	keys := make([]string, 0, len(structs))
	for key := range structs {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	lines := []string{}
	for _, key := range keys {
		name, _ := json.Marshal(key)
		fields, err := json.Marshal(structs[key])
		if err != nil {
			panic(err)
		}
		lines = append(lines, "  "+string(name)+": "+string(fields))
	}
	os.Stdout.WriteString("{\"roots\": " + string(rootsJSON) + ",\n \"structs\": {\n" + strings.Join(lines, ",\n") + "\n }}\n")
}
