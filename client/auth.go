package client

import (
	"context"

	"connectrpc.com/connect"

	strandv1 "github.com/strandhq/strand/api/strand/v1"
	"github.com/strandhq/strand/api/strand/v1/strandv1connect"
)

// The token and permission calls of AdminService (docs/operating.md,
// "Security"), sent to the leader like every admin call. A CreateToken
// whose answer was lost and that is retried can leave a token nobody holds
// the secret of: `strandctl token list` shows it, and revoking it by id
// removes it.

func (a *adminClient) CreateToken(ctx context.Context, req *connect.Request[strandv1.CreateTokenRequest]) (*connect.Response[strandv1.CreateTokenResponse], error) {
	return adminCall(ctx, a, "CreateToken", req, strandv1connect.AdminServiceClient.CreateToken)
}

func (a *adminClient) RevokeToken(ctx context.Context, req *connect.Request[strandv1.RevokeTokenRequest]) (*connect.Response[strandv1.RevokeTokenResponse], error) {
	return adminCall(ctx, a, "RevokeToken", req, strandv1connect.AdminServiceClient.RevokeToken)
}

func (a *adminClient) ListTokens(ctx context.Context, req *connect.Request[strandv1.ListTokensRequest]) (*connect.Response[strandv1.ListTokensResponse], error) {
	return adminCall(ctx, a, "ListTokens", req, strandv1connect.AdminServiceClient.ListTokens)
}

func (a *adminClient) GrantPermission(ctx context.Context, req *connect.Request[strandv1.GrantPermissionRequest]) (*connect.Response[strandv1.GrantPermissionResponse], error) {
	return adminCall(ctx, a, "GrantPermission", req, strandv1connect.AdminServiceClient.GrantPermission)
}

func (a *adminClient) RevokePermission(ctx context.Context, req *connect.Request[strandv1.RevokePermissionRequest]) (*connect.Response[strandv1.RevokePermissionResponse], error) {
	return adminCall(ctx, a, "RevokePermission", req, strandv1connect.AdminServiceClient.RevokePermission)
}

func (a *adminClient) ListPermissions(ctx context.Context, req *connect.Request[strandv1.ListPermissionsRequest]) (*connect.Response[strandv1.ListPermissionsResponse], error) {
	return adminCall(ctx, a, "ListPermissions", req, strandv1connect.AdminServiceClient.ListPermissions)
}
