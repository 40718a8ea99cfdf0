module github.com/strandhq/strand/examples

go 1.26.7

require (
	connectrpc.com/connect v1.21.1
	github.com/strandhq/strand v0.0.0
)

require (
	connectrpc.com/grpchealth v1.5.0 // indirect
	connectrpc.com/grpcreflect v1.3.1 // indirect
	golang.org/x/net v0.61.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261012220534-4341edf3f941 // indirect
	google.golang.org/protobuf v1.36.13-0.20261016172727-e9ee2a76ab8e // indirect
)

// The examples build against the client in this checkout, with the main
// module's own replacements.
replace (
	github.com/dgraph-io/badger/v4 => ../third_party/badger
	github.com/strandhq/strand => ../
)
