// Package auth authenticates Strand's clients and authorises their calls
// (docs/operating.md, "Security"): bearer tokens stored only as hashes in
// etcd, or a principal the transport proved (a client certificate), and
// per-principal permissions on stream names or prefixes, read from an etcd
// watch-fed cache, never per request. The broker adds per-principal limits:
// publish bytes per second and concurrent subscriptions.
//
// One table (Rules) maps every procedure of the generated services to the
// permission it needs; a procedure missing from it is refused.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Permission is what a grant allows.
type Permission string

const (
	// Publish allows Publish (and Locate) on the streams granted.
	Publish Permission = "publish"
	// Read allows Read, Subscribe, the cursor calls, Locate and GetStream
	// on the streams granted; ListStreams with "*".
	Read Permission = "read"
	// Admin allows create, delete, update and the operator actions on the
	// streams granted; ListAttention and token and permission management
	// with "*". It implies Publish and Read on the same streams: an admin
	// could grant itself both anyway, so keeping them apart would protect
	// nothing.
	Admin Permission = "admin"
)

// Permissions lists every permission, for messages and flags.
var Permissions = []Permission{Publish, Read, Admin}

// ErrInvalid is returned for a principal, permission, pattern or token id
// outside its form.
var ErrInvalid = errors.New("auth: invalid")

// ParsePermission reads a permission name.
func ParsePermission(s string) (Permission, error) {
	for _, p := range Permissions {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: permission %q: want publish, read or admin", ErrInvalid, s)
}

// implies reports whether a grant of have allows want.
func (have Permission) implies(want Permission) bool {
	return have == want || have == Admin
}

var principalForm = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@:+=-]{0,127}$`)

// ValidatePrincipal checks a principal name: letters, digits and
// ._@:+=- , at most 128 bytes, no "/" (it is part of an etcd key,
// cluster.Schema.GrantKey).
func ValidatePrincipal(p string) error {
	if !principalForm.MatchString(p) {
		return fmt.Errorf("%w: principal %q must match [A-Za-z0-9][A-Za-z0-9._@:+=-]{0,127}", ErrInvalid, p)
	}
	return nil
}

// All is the pattern of every stream, and the one the cluster-wide calls
// (ListStreams, ListAttention, token and permission management) need.
const All = "*"

var patternForm = regexp.MustCompile(`^(\*|[a-z0-9][a-z0-9._-]{0,127}\*?)$`)

// ValidatePattern checks a grant's streams: a stream name (exactly that
// stream), a stream name prefix ending in "*" (every stream whose name
// starts with what comes before it: "orders.*" matches "orders.eu" but
// not "orders"), or "*" alone (every stream).
func ValidatePattern(p string) error {
	if !patternForm.MatchString(p) {
		return fmt.Errorf("%w: streams %q: want a stream name, a name prefix ending in \"*\" (orders.*), or \"*\"", ErrInvalid, p)
	}
	return nil
}

// Match reports whether pattern covers stream.
func Match(pattern, stream string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(stream, prefix)
	}
	return pattern == stream
}

// Token secrets: TokenPrefix and 32 random bytes in hex. The prefix lets
// secret scanners and people tell a Strand token when they see one.
const (
	TokenPrefix      = "stk_"
	tokenRandomBytes = 32
	// TokenIDLen is the length of a token id: the first 64 bits of the
	// secret's SHA-256 in hex, enough that two tokens never share one
	// (creation refuses a taken id all the same).
	TokenIDLen = 16
)

// NewSecret returns a new token secret.
func NewSecret() (string, error) {
	b := make([]byte, tokenRandomBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("auth: token: %w", err)
	}
	return TokenPrefix + hex.EncodeToString(b), nil
}

// HashSecret is what etcd stores of a secret: its SHA-256, in hex. No salt
// and no slow KDF: those protect low-entropy passwords from tables and
// guessing, and a secret of 256 random bits can be neither looked up nor
// guessed, so a plain preimage-resistant hash is as strong as any KDF while
// costing a microsecond per call instead of milliseconds.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// TokenID is the id of the token whose hash is hash.
func TokenID(hash string) string { return hash[:TokenIDLen] }

var tokenIDForm = regexp.MustCompile(`^[0-9a-f]{16}$`)

// ValidateTokenID checks a token id (16 lower-case hex digits).
func ValidateTokenID(id string) error {
	if !tokenIDForm.MatchString(id) {
		return fmt.Errorf("%w: token id %q: want 16 hex digits as `strandctl token list` shows", ErrInvalid, id)
	}
	return nil
}

// TokenRecord is the value of cluster.Schema.TokenKey: a token without its
// secret.
type TokenRecord struct {
	ID        string    `json:"id"`
	Principal string    `json:"principal"`
	SHA256    string    `json:"sha256"`
	Created   time.Time `json:"created"`
}

// GrantRecord is the value of cluster.Schema.GrantKey.
type GrantRecord struct {
	Principal  string     `json:"principal"`
	Permission Permission `json:"permission"`
	Streams    string     `json:"streams"`
	Created    time.Time  `json:"created"`
}
