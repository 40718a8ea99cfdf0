// Package client is the Go client for Strand.
//
// Other modules import it as github.com/strandhq/strand/client, with the
// generated API in github.com/strandhq/strand/api/strand/v1 (package
// strandv1): records published are strandv1.Record, records read or
// received are strandv1.StoredRecord, and the requests and responses are the
// generated messages too, so a record needs no conversion on its way in or
// out. Admin returns the generated strandv1connect.AdminServiceClient. The
// runnable examples below, and the module in examples/ of the repository,
// show a program from connecting to reading back.
//
// Where the cluster is: Config.Controller and Config.Brokers, which a
// program usually takes from flags or from STRAND_CONTROLLER and
// STRAND_BROKER; DevClusterConfig reads them from the cluster.json of a dev
// cluster (strandctl dev, make run).
//
// A Client finds the owner of a stream with StreamService.Locate on any broker
// it knows, caches it per stream and sends publishes, reads and cursor
// commits there. It rides through owner changes (docs/api.md, "Redirects
// and retries"): a FailedPrecondition carrying an owner hint redirects to
// the hinted address; Unavailable, a connection error, an attempt that timed out
// or a hint without an address make it locate the owner again and retry with
// jittered exponential backoff until the caller's deadline (or
// Config.RetryBudget when the context has none).
//
// Publishes are idempotent by default (docs/api.md, "Idempotent publish"):
// the client stamps a producer id and per-stream sequence numbers 1, 2, 3…
// on each record, and a retry reuses the sequences it was given, so a broker stores a retried record once
// and answers with its original offset. To keep sequences in order on the
// wire, an idempotent client sends one publish request per stream at a time
// and merges concurrent Publish calls into that request (client-side group
// commit); throughput comes from batching rather than from parallel requests.
// Publish waits for its records' confirm; PublishAsync returns at once and
// calls back with the same answer, so one goroutine can keep a window of
// records in flight, as a Kafka or NATS producer does.
//
// What a Client keeps per stream (its cached owner, its lanes with their
// producer ids and sequences) is freed once the stream has been idle for
// Config.StreamIdle with nothing queued or in flight, so a long-lived client
// that publishes to many short-lived streams stays bounded; a stream
// published to again later starts a new producer session.
//
// Admin calls go to the controller leader with the same retries. A retried
// CreateStream or DeleteStream whose earlier attempt may have been applied,
// only its answer lost, reports what the call did: a later NotFound from
// DeleteStream, or a later AlreadyExists from CreateStream for a stream with
// the configuration asked for, is success (see Client.Admin). DeleteStream
// deletes only the incarnation of the stream it found, so its retries leave
// a stream created again under the name meanwhile alone.
//
// Subscriptions resume after an error at the next offset not yet delivered and
// drop anything below it, so a caller sees each offset once, in order.
//
// Errors keep the cluster's answer: connect.CodeOf(err) is its Connect
// code, errors.As with a *connect.Error finds it, and OwnerHint, LeaderHint
// and FieldViolations read its typed details; an error after the retries
// ran out also matches context.DeadlineExceeded. No error's message needs
// to be read. docs/errors.md in the repository lists, per RPC, each code,
// when it comes, what it carries and what to do about it.
package client
