package auth

import (
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
)

// Scope says what a rule checks its permission on.
type Scope int

const (
	// OnStream: the permission on the stream the request names in Field.
	OnStream Scope = iota
	// OnCluster: the permission granted on "*" itself (a call about every
	// stream, or about the cluster's credentials).
	OnCluster
	// Authenticated: any known principal, no permission.
	Authenticated
	// Peer: not a client call at all; authorised by node identity (the
	// peer token, rpcserver.RequirePeerToken), never by grants.
	Peer
	// OnEntries: a call carrying several requests, each naming its own
	// stream (PublishMany). The guard authenticates the call and leaves
	// each entry's permission on its stream, and its limit, to the
	// handler (CheckEntry), so one entry refused fails alone.
	OnEntries
)

// Limit is the per-principal limit a procedure counts against (broker).
type Limit int

const (
	NoLimit Limit = iota
	// PublishBytes: the request's size against the principal's publish
	// bytes per second.
	PublishBytes
	// Subscriptions: one of the principal's concurrent subscriptions while
	// the call lasts.
	Subscriptions
)

// Rule is what a procedure needs.
type Rule struct {
	Scope Scope
	// Perms: any one of them suffices (OnStream, OnCluster).
	Perms []Permission
	// Field names the request field holding the stream (OnStream; with
	// OnEntries, each entry's is "stream").
	Field string
	Limit Limit
}

func onStream(field string, perms ...Permission) Rule {
	return Rule{Scope: OnStream, Perms: perms, Field: field}
}

func onCluster(perm Permission) Rule { return Rule{Scope: OnCluster, Perms: []Permission{perm}} }

// Rules maps every procedure of Strand's services to what it needs. A
// procedure without a row is refused (PermissionDenied), and
// TestRulesCoverEveryProcedure fails for one, so a new RPC cannot be served
// without someone deciding who may call it.
var Rules = map[string]Rule{
	// Broker, strand.v1.StreamService.
	strandv1connect.StreamServicePublishProcedure: {Scope: OnStream, Perms: []Permission{Publish}, Field: "stream", Limit: PublishBytes},
	// Each entry as a Publish of its stream (CheckEntry).
	strandv1connect.StreamServicePublishManyProcedure:  {Scope: OnEntries, Perms: []Permission{Publish}, Limit: PublishBytes},
	strandv1connect.StreamServiceReadProcedure:         onStream("stream", Read),
	strandv1connect.StreamServiceSubscribeProcedure:    {Scope: OnStream, Perms: []Permission{Read}, Field: "stream", Limit: Subscriptions},
	strandv1connect.StreamServiceCommitCursorProcedure: onStream("stream", Read),
	strandv1connect.StreamServiceGetCursorProcedure:    onStream("stream", Read),
	// Publishers and readers both find a stream's owner first.
	strandv1connect.StreamServiceLocateProcedure: onStream("stream", Publish, Read),

	// Controller, strand.v1.AdminService.
	strandv1connect.AdminServiceCreateStreamProcedure: onStream("name", Admin),
	strandv1connect.AdminServiceDeleteStreamProcedure: onStream("name", Admin),
	strandv1connect.AdminServiceUpdateStreamProcedure: onStream("name", Admin),
	// The status of one stream is for those who read it.
	strandv1connect.AdminServiceGetStreamProcedure:   onStream("name", Read),
	strandv1connect.AdminServiceListStreamsProcedure: onCluster(Read),
	// Clients given only the controller's address find brokers with it
	// (client.Config.Controller); addresses are no secret from a principal
	// that may call a broker at all.
	strandv1connect.AdminServiceListBrokersProcedure:      {Scope: Authenticated},
	strandv1connect.AdminServiceListAttentionProcedure:    onCluster(Admin),
	strandv1connect.AdminServiceAcceptOwnerLossProcedure:  onStream("stream", Admin),
	strandv1connect.AdminServiceWithdrawRecoveryProcedure: onStream("stream", Admin),
	strandv1connect.AdminServiceFailoverProcedure:         onStream("stream", Admin),
	strandv1connect.AdminServiceCreateTokenProcedure:      onCluster(Admin),
	strandv1connect.AdminServiceRevokeTokenProcedure:      onCluster(Admin),
	strandv1connect.AdminServiceListTokensProcedure:       onCluster(Admin),
	strandv1connect.AdminServiceGrantPermissionProcedure:  onCluster(Admin),
	strandv1connect.AdminServiceRevokePermissionProcedure: onCluster(Admin),
	strandv1connect.AdminServiceListPermissionsProcedure:  onCluster(Admin),
	// Drains and owner moves change where every stream lives.
	strandv1connect.AdminServiceDrainBrokerProcedure:      onCluster(Admin),
	strandv1connect.AdminServiceUndrainBrokerProcedure:    onCluster(Admin),
	strandv1connect.AdminServiceGetRebalancePlanProcedure: onCluster(Admin),

	// Broker, strand.v1.ReplicationService: peers only. Follow, Seal,
	// SealMany and Handover (the controller pausing an owner) are authorised by node identity (the peer token, and a node certificate
	// once TLS is on), never by a client's grants: a grant could otherwise
	// let a client fence copies (docs/operating.md, "Peer token").
	strandv1connect.ReplicationServiceFollowProcedure:   {Scope: Peer},
	strandv1connect.ReplicationServiceSealProcedure:     {Scope: Peer},
	strandv1connect.ReplicationServiceSealManyProcedure: {Scope: Peer},
	strandv1connect.ReplicationServiceHandoverProcedure: {Scope: Peer},
}
