package devcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// The control endpoint is how `strandctl dev stop|start NODE` reach the
// running dev process: plain HTTP on an ephemeral loopback port that
// cluster.json names. A call carries the cluster's peer token as a bearer
// token: whoever can read the token file (mode 0600) can already seal any
// copy, and nobody else on the machine can stop a child.

// Control actions.
const (
	ActionStop  = "stop"
	ActionStart = "start"
)

// controlRequest and controlResponse are the endpoint's JSON bodies.
type controlRequest struct {
	Node string `json:"node"`
}

type controlResponse struct {
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
	// Code names the sentinel an error wraps, so the client's error
	// matches errors.Is as the cluster's did.
	Code string `json:"code,omitempty"`
}

// controlCodes are the sentinels that cross the endpoint.
var controlCodes = map[string]error{
	"unknown_node": ErrUnknownNode,
	"running":      ErrRunning,
	"stopped":      ErrStopped,
	"closed":       ErrClosed,
}

// ErrControl is a control call that did not reach, or was refused by, the
// dev process for a reason other than those above.
var ErrControl = errors.New("devcluster: control")

type controlServer struct {
	addr string
	srv  *http.Server
}

func (c *Cluster) serveControl() (*controlServer, error) {
	ln, err := net.Listen("tcp", loopback(0))
	if err != nil {
		return nil, fmt.Errorf("devcluster: control endpoint: %w", err)
	}
	want := sha256.Sum256([]byte("Bearer " + c.peerToken))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/{action}", func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			writeControl(w, http.StatusUnauthorized, controlResponse{Error: "devcluster: control: missing or wrong peer token (the one in " + c.tokenFile + ")"})
			return
		}
		var req controlRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil || req.Node == "" {
			writeControl(w, http.StatusBadRequest, controlResponse{Error: "devcluster: control: want a JSON body {\"node\": NAME}"})
			return
		}
		var msg string
		switch r.PathValue("action") {
		case ActionStop:
			err = c.Stop(req.Node)
			msg = req.Node + " stopped; the supervisor leaves it down until dev start " + req.Node
		case ActionStart:
			err = c.Restart(r.Context(), req.Node)
			msg = fmt.Sprintf("%s started (pid %d) and ready", req.Node, c.PID(req.Node))
		default:
			writeControl(w, http.StatusNotFound, controlResponse{Error: "devcluster: control: unknown action " + r.PathValue("action")})
			return
		}
		if err != nil {
			res := controlResponse{Error: err.Error()}
			status := http.StatusInternalServerError
			for code, sentinel := range controlCodes {
				if errors.Is(err, sentinel) {
					res.Code, status = code, http.StatusConflict
				}
			}
			if errors.Is(err, ErrUnknownNode) {
				status = http.StatusNotFound
			}
			writeControl(w, status, res)
			return
		}
		writeControl(w, http.StatusOK, controlResponse{Message: msg})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return &controlServer{addr: ln.Addr().String(), srv: srv}, nil
}

func writeControl(w http.ResponseWriter, status int, res controlResponse) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(res)
}

// close stops serving; a call under way that then starts or stops a child
// finds the cluster closed.
func (s *controlServer) close() { _ = s.srv.Close() }

// remoteError is an error the dev process answered, as it worded it, and
// wrapping the sentinel it wrapped there.
type remoteError struct {
	sentinel error
	msg      string
}

func (e remoteError) Error() string { return e.msg }
func (e remoteError) Unwrap() error { return e.sentinel }

// Control asks the dev process that wrote info to stop or start one child
// (ActionStop, ActionStart) and returns what it did.
func Control(ctx context.Context, info Info, action, node string) (string, error) {
	if info.Control == "" {
		return "", fmt.Errorf("%w: the dev process (pid %d) has no control endpoint (an older strandctl started it): restart it", ErrControl, info.PID)
	}
	token, err := ReadPeerToken(info)
	if err != nil {
		return "", err
	}
	body, _ := json.Marshal(controlRequest{Node: node})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+info.Control+"/v1/"+action, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrControl, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrControl, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var res controlResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&res); err != nil {
		return "", fmt.Errorf("%w: %s answered %s: %w", ErrControl, info.Control, resp.Status, err)
	}
	if resp.StatusCode != http.StatusOK {
		sentinel, ok := controlCodes[res.Code]
		if !ok {
			sentinel = ErrControl
		}
		return "", remoteError{sentinel: sentinel, msg: res.Error}
	}
	return res.Message, nil
}
