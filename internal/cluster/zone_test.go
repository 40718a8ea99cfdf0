package cluster

import (
	"errors"
	"testing"
)

func TestValidateZone(t *testing.T) {
	for _, z := range []string{"", "a", "eu-west-1a", "rack_7.r2"} {
		if err := ValidateZone(z); err != nil {
			t.Errorf("ValidateZone(%q) = %v, want nil", z, err)
		}
	}
	for _, z := range []string{"-a", "a b", "a/b", string(make([]byte, 65))} {
		if err := ValidateZone(z); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateZone(%q) = %v, want ErrInvalidName", z, err)
		}
	}
}
