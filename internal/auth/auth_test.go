package auth

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	// The generated services register their descriptors.
	_ "github.com/strandhq/strand/api/strand/v1"
)

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, stream string
		want            bool
	}{
		{"orders", "orders", true},
		{"orders", "orders.eu", false},
		{"orders", "order", false},
		{"orders.*", "orders.eu", true},
		{"orders.*", "orders.eu.paris", true},
		{"orders.*", "orders.", true},
		{"orders.*", "orders", false},
		{"orders.*", "ordersx", false},
		{"orders*", "orders", true},
		{"orders*", "ordersx", true},
		{"orders*", "order", false},
		{"*", "anything", true},
		{"*", "", true},
		{"a*", "b", false},
	} {
		if got := Match(tc.pattern, tc.stream); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.pattern, tc.stream, got, tc.want)
		}
	}
}

func TestValidatePattern(t *testing.T) {
	for _, ok := range []string{"*", "orders", "orders.*", "orders*", "a", "a-b_c.d*"} {
		if err := ValidatePattern(ok); err != nil {
			t.Errorf("ValidatePattern(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "**", "*orders", "or*ders", "Orders", "orders/x", "orders.**", ".x", strings.Repeat("a", 129)} {
		if err := ValidatePattern(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidatePattern(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestValidatePrincipal(t *testing.T) {
	for _, ok := range []string{"alice", "svc-orders", "alice@example.com", "CN=x", "a:b+c"} {
		if err := ValidatePrincipal(ok); err != nil {
			t.Errorf("ValidatePrincipal(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a/b", "has space", "-x", strings.Repeat("a", 129)} {
		if err := ValidatePrincipal(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidatePrincipal(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestImplies(t *testing.T) {
	for _, tc := range []struct {
		have, want Permission
		ok         bool
	}{
		{Publish, Publish, true}, {Publish, Read, false}, {Publish, Admin, false},
		{Read, Read, true}, {Read, Publish, false}, {Read, Admin, false},
		{Admin, Admin, true}, {Admin, Read, true}, {Admin, Publish, true},
	} {
		if got := tc.have.implies(tc.want); got != tc.ok {
			t.Errorf("%s implies %s = %v, want %v", tc.have, tc.want, got, tc.ok)
		}
	}
}

func TestTokenSecretAndID(t *testing.T) {
	a, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	if a == b || !strings.HasPrefix(a, TokenPrefix) || len(a) != len(TokenPrefix)+64 {
		t.Fatalf("secrets %q, %q: want two different %s+64 hex digits", a, b, TokenPrefix)
	}
	h := HashSecret(a)
	if len(h) != 64 || strings.Contains(h, a[len(TokenPrefix):]) {
		t.Fatalf("hash %q of %q", h, a)
	}
	if err := ValidateTokenID(TokenID(h)); err != nil {
		t.Fatal(err)
	}
}

// procedures lists every procedure of the strand.v1 services as the
// generated descriptors have them.
func procedures(t *testing.T) []string {
	var out []string
	protoregistry.GlobalFiles.RangeFilesByPackage("strand.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				out = append(out, fmt.Sprintf("/%s/%s", sd.FullName(), sd.Methods().Get(j).Name()))
			}
		}
		return true
	})
	if len(out) == 0 {
		t.Fatal("no strand.v1 services registered")
	}
	return out
}

// Every procedure of the generated services has a row, and every row
// names a real procedure, a stream field of its request, and permissions.
func TestRulesCoverEveryProcedure(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range procedures(t) {
		seen[p] = true
		if _, ok := Rules[p]; !ok {
			t.Errorf("procedure %s has no row in Rules: decide who may call it", p)
		}
	}
	for p, r := range Rules {
		if !seen[p] {
			t.Errorf("Rules row %s names no procedure of the generated services", p)
		}
		switch r.Scope {
		case OnStream, OnCluster, OnEntries:
			if len(r.Perms) == 0 {
				t.Errorf("%s: no permission", p)
			}
		case Authenticated, Peer:
			if len(r.Perms) != 0 || r.Limit != NoLimit {
				t.Errorf("%s: permissions or a limit on a rule that checks none", p)
			}
		}
		if r.Scope != OnStream {
			continue
		}
		svc, method, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		in := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(method)).Input()
		if fd := in.Fields().ByName(protoreflect.Name(r.Field)); fd == nil || fd.Kind() != protoreflect.StringKind {
			t.Errorf("%s: request %s has no string field %q", p, in.FullName(), r.Field)
		}
	}
}

// The permission each client-facing procedure needs, as docs/operating.md
// ("Security") lists it.
func TestRulesTable(t *testing.T) {
	want := map[string]string{
		"/strand.v1.StreamService/Publish":         "stream:publish",
		"/strand.v1.StreamService/PublishMany":     "entries:publish",
		"/strand.v1.StreamService/Read":            "stream:read",
		"/strand.v1.StreamService/Subscribe":       "stream:read",
		"/strand.v1.StreamService/CommitCursor":    "stream:read",
		"/strand.v1.StreamService/GetCursor":       "stream:read",
		"/strand.v1.StreamService/Locate":          "stream:publish|read",
		"/strand.v1.AdminService/CreateStream":     "name:admin",
		"/strand.v1.AdminService/DeleteStream":     "name:admin",
		"/strand.v1.AdminService/UpdateStream":     "name:admin",
		"/strand.v1.AdminService/GetStream":        "name:read",
		"/strand.v1.AdminService/ListStreams":      "*:read",
		"/strand.v1.AdminService/ListBrokers":      "authenticated",
		"/strand.v1.AdminService/ListAttention":    "*:admin",
		"/strand.v1.AdminService/AcceptOwnerLoss":  "stream:admin",
		"/strand.v1.AdminService/WithdrawRecovery": "stream:admin",
		"/strand.v1.AdminService/Failover":         "stream:admin",
		"/strand.v1.AdminService/CreateToken":      "*:admin",
		"/strand.v1.AdminService/RevokeToken":      "*:admin",
		"/strand.v1.AdminService/ListTokens":       "*:admin",
		"/strand.v1.AdminService/GrantPermission":  "*:admin",
		"/strand.v1.AdminService/RevokePermission": "*:admin",
		"/strand.v1.AdminService/ListPermissions":  "*:admin",
		"/strand.v1.ReplicationService/Follow":     "peer",
		"/strand.v1.ReplicationService/Seal":       "peer",
	}
	for p, w := range want {
		r, ok := Rules[p]
		if !ok {
			t.Errorf("%s: no rule", p)
			continue
		}
		if got := describe(r); got != w {
			t.Errorf("%s needs %s, want %s", p, got, w)
		}
	}
	if Rules["/strand.v1.StreamService/Publish"].Limit != PublishBytes || Rules["/strand.v1.StreamService/PublishMany"].Limit != PublishBytes ||
		Rules["/strand.v1.StreamService/Subscribe"].Limit != Subscriptions {
		t.Error("Publish and PublishMany must count publish bytes and Subscribe subscriptions")
	}
}

func describe(r Rule) string {
	perms := make([]string, len(r.Perms))
	for i, p := range r.Perms {
		perms[i] = string(p)
	}
	switch r.Scope {
	case OnStream:
		return r.Field + ":" + strings.Join(perms, "|")
	case OnCluster:
		return "*:" + strings.Join(perms, "|")
	case OnEntries:
		return "entries:" + strings.Join(perms, "|")
	case Authenticated:
		return "authenticated"
	default:
		return "peer"
	}
}
