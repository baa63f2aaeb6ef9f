package model

import "errors"

// The errors an ObjectError wraps, for errors.Is.
var (
	// ErrInvalid is a field that does not parse or is out of range.
	ErrInvalid = errors.New("invalid")
	// ErrDuplicate is a second value where only one is allowed (a second
	// ClusterIP of a family, a second port with the same name and protocol).
	ErrDuplicate = errors.New("duplicate")
	// ErrNoService is an EndpointSlice that names no Service, or a Service
	// that does not exist.
	ErrNoService = errors.New("no such Service")
)

func objErr(kind, key, field string, err error) ObjectError {
	return ObjectError{Kind: kind, Key: key, Field: field, Err: err}
}
