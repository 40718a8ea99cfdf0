// Package tlsconfig is Strand's TLS: TLS 1.3 configurations for servers and
// clients whose certificates and CA pool are read from files and read again
// when the files change (a renewed certificate is served without a
// restart), the identities certificates carry, and the making of a CA and
// of node and client certificates (strandctl cert, strandctl dev --secure,
// the secure tests). Everything is crypto/tls and crypto/x509
// (docs/operating.md, "Security").
//
// Identities. A certificate names who holds it in a URI SAN:
//
//	strand://node/NAME      a node: a broker (NAME is its --node), the
//	                        controller or the recoverer (NAME is its --name)
//	strand://client/NAME    a client principal (an operator, a program)
//
// The common name repeats NAME for people reading the certificate; only
// the URI SAN counts. Peers (Follow, Seal) must present a node certificate,
// and a Follow's claimed node must be the certificate's NAME.
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"
)

// URIScheme is the scheme of the URI SANs that carry an identity.
const URIScheme = "strand"

// The kinds of identity, the URI SAN's host.
const (
	KindNode   = "node"
	KindClient = "client"
)

// IdentityURI is the URI SAN of an identity of kind (KindNode or
// KindClient) named name.
func IdentityURI(kind, name string) *url.URL {
	return &url.URL{Scheme: URIScheme, Host: kind, Path: "/" + name}
}

// Identity is who a verified certificate names: a node or a client
// principal.
type Identity struct {
	Kind string
	Name string
}

// CertIdentity reads the identity of a certificate from its URI SANs: the
// first strand:// URI with a known kind and a name. ok is false when it has
// none.
func CertIdentity(cert *x509.Certificate) (Identity, bool) {
	for _, u := range cert.URIs {
		if u.Scheme != URIScheme || (u.Host != KindNode && u.Host != KindClient) {
			continue
		}
		name := strings.TrimPrefix(u.Path, "/")
		if name == "" || strings.Contains(name, "/") {
			continue
		}
		return Identity{Kind: u.Host, Name: name}, true
	}
	return Identity{}, false
}

// PeerIdentity is the identity of the other side of a connection, as its
// verified certificate names it: node is set for a node certificate,
// principal for a client certificate. ok is false for a connection without
// TLS, without a verified certificate (a client may connect without one:
// it then authenticates, if at all, with a bearer token), or with a
// certificate that names no identity. Only a chain the server verified
// against its CA pool counts (VerifiedChains), never a certificate merely
// presented.
func PeerIdentity(cs *tls.ConnectionState) (node, principal string, ok bool) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", "", false
	}
	id, ok := CertIdentity(cs.VerifiedChains[0][0])
	if !ok {
		return "", "", false
	}
	if id.Kind == KindNode {
		return id.Name, "", true
	}
	return "", id.Name, true
}

// String is the identity as its URI SAN spells it.
func (id Identity) String() string { return IdentityURI(id.Kind, id.Name).String() }

// ValidateName refuses names that cannot be an identity's: empty, or with
// a character outside letters, digits and "-_.@" (a name goes into a URI
// path and a file name).
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("tlsconfig: empty name")
	}
	if len(name) > 128 {
		return fmt.Errorf("tlsconfig: name %q longer than 128 bytes", name)
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.@", c)
		if !ok {
			return fmt.Errorf("tlsconfig: name %q: %q is not a letter, digit or one of -_.@", name, c)
		}
	}
	return nil
}
