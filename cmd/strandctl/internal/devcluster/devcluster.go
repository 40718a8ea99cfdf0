// Package devcluster runs a local Strand cluster as processes: an embedded
// etcd in this process, and strand-controller, strand-recoverer and N
// strand-broker children on loopback (docs/operating.md, "strandctl dev").
// `strandctl dev`, `strandctl bench` and the CLI smoke test share it, so the
// cluster they exercise is the one a user runs.
package devcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/grpchealth"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/auth"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/rpcserver"
	"github.com/strandhq/strand/internal/tlsconfig"
)

// Binary names of the services.
const (
	BrokerBin     = "strand-broker"
	ControllerBin = "strand-controller"
	RecovererBin  = "strand-recoverer"
)

// Process names (and node ids for brokers).
const (
	Controller = "controller"
	Recoverer  = "recoverer"
)

// BrokerZone is the zone of broker i (1-based) among zones, given
// round-robin; "" when there are none.
func BrokerZone(zones []string, i int) string {
	if len(zones) == 0 {
		return ""
	}
	return zones[(i-1)%len(zones)]
}

// BrokerNode is the node id of broker i (1-based).
func BrokerNode(i int) string { return "broker-" + strconv.Itoa(i) }

// Defaults for Options fields left zero.
const (
	DefaultDir          = client.DefaultDevClusterDir
	DefaultBrokers      = 3
	DefaultPortBase     = 2379 // etcd on its usual 2379 (peer 2380), so `go tool etcdctl` needs no flags
	DefaultReadyTimeout = 60 * time.Second
	DefaultStopTimeout  = 10 * time.Second
)

// Options configures a dev cluster.
type Options struct {
	// Dir holds etcd's data, each broker's data, logs and cluster.json;
	// kept across restarts.
	Dir      string
	Brokers  int
	PortBase int
	// BinDir is where the service binaries are; empty means next to the
	// running executable, else PATH.
	BinDir string
	Prefix string
	// Log receives one line per notable event (a child exiting).
	Log io.Writer
	// ReadyTimeout bounds the wait for every service to be healthy.
	ReadyTimeout time.Duration
	// StopTimeout is how long a child may take to stop after SIGTERM.
	StopTimeout time.Duration
	// Zones are the brokers' zones, given round-robin: broker i gets
	// Zones[(i-1) % len(Zones)] as its --zone. Empty: no zones.
	Zones []string
	// ReplaceAfter is the controller's --replace-after (zero: its
	// default, 10m): how long a stream's copy may be missing before the
	// controller replaces it on another broker.
	ReplaceAfter time.Duration
	// BrokerArgs, ControllerArgs and RecovererArgs are extra flags.
	BrokerArgs     []string
	ControllerArgs []string
	RecovererArgs  []string
	// Etcd is the embedded etcd's auto-compaction and quota; zero fields
	// take etcdcfg's defaults (docs/etcd.md).
	Etcd etcdcfg.Options
	// Supervise restarts a child that exits without being asked to, with
	// the same flags, environment and data dir, after a back-off
	// (RestartMin, doubling up to RestartMax; back to RestartMin once the
	// child has run RestartReset). Without it a dead child stays dead
	// until Restart: what the tests and the bench that kill one want.
	Supervise bool
	// Secure runs the cluster with TLS: a CA, node certificates and an
	// admin client certificate under DIR/certs (kept across starts), every
	// child with --certs-dir, the embedded etcd on https with client
	// certificates, and cluster.json naming the admin's files. Without it
	// every child runs with --insecure.
	Secure bool
	// Control serves the control endpoint (control.go) that `strandctl dev
	// stop|start NODE` use, on a loopback port cluster.json names.
	Control bool
}

// Back-off of a supervised restart.
const (
	RestartMin   = 200 * time.Millisecond
	RestartMax   = 5 * time.Second
	RestartReset = 10 * time.Second
)

// Exit reports a child that exited without being asked to.
type Exit struct {
	Name string
	PID  int
	Err  error
}

// Cluster is a running dev cluster.
type Cluster struct {
	opts      Options
	peerToken string
	tokenFile string
	etcd      *embed.Etcd
	etcdCl    *clientv3.Client
	schema    cluster.Schema
	exits     chan Exit
	quit      chan struct{} // closed by Close: pending restarts give up
	restarts  sync.WaitGroup
	control   *controlServer
	// clientTLS is the admin client's TLS of a secure cluster (nil: plain),
	// tlsInfo its files for cluster.json.
	clientTLS *tlsconfig.Reloader
	tlsInfo   *TLSInfo

	mu        sync.Mutex
	children  map[string]*child
	order     []string // controller, recoverer, broker-1..N
	supervise bool     // Options.Supervise, from the end of Start on
	closed    bool

	// infoMu orders cluster.json's writes with Close's removal, so a
	// restart that ends as the cluster closes cannot leave a file that
	// names a cluster that is gone.
	infoMu sync.Mutex
}

// child is one service; each start of it is a new proc.
type child struct {
	name    string
	addr    string
	bin     string
	args    []string
	proc    *proc         // the last process started; nil before the first
	held    bool          // stopped by Stop: not restarted until Restart
	backoff time.Duration // the last supervised restart's delay
}

// proc is one process of a child.
type proc struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
	stop bool          // stopping was asked for; the exit is expected
	t0   time.Time
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Start starts etcd and the services, waits until every service is healthy
// and every broker registered, and writes DIR/cluster.json. ctx bounds the
// start only; the cluster runs until Close.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	fillDefaults(&opts)
	if opts.Brokers < 1 {
		return nil, fmt.Errorf("devcluster: --brokers must be at least 1, got %d", opts.Brokers)
	}
	if opts.PortBase < 1 || opts.PortBase+10+opts.Brokers > 65535 {
		return nil, fmt.Errorf("devcluster: --port-base %d leaves no room for %d brokers", opts.PortBase, opts.Brokers)
	}
	if err := opts.Etcd.Validate("etcd-"); err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = dir
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	// A cluster.json left by a cluster that is gone must not be mistaken
	// for this one before it is ready. One of a cluster still running is
	// left alone, and this start refused: it would fail on the running
	// cluster's ports after cutting every other command off from it.
	if info, err := ReadInfo(dir); err == nil && info.PID > 0 && info.PID != os.Getpid() && alive(info.PID) {
		return nil, fmt.Errorf("devcluster: a cluster already runs from %s (strandctl pid %d); stop it or use another data dir", dir, info.PID)
	}
	_ = os.Remove(filepath.Join(dir, InfoFile))
	bins, err := findBinaries(opts.BinDir)
	if err != nil {
		return nil, err
	}
	peerToken, tokenFile, err := loadPeerToken(dir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		opts:      opts,
		peerToken: peerToken,
		tokenFile: tokenFile,
		schema:    cluster.NewSchema(opts.Prefix),
		exits:     make(chan Exit, 16),
		quit:      make(chan struct{}),
		children:  make(map[string]*child),
	}
	if opts.Secure {
		names := []string{Controller, Recoverer}
		for i := 1; i <= opts.Brokers; i++ {
			names = append(names, BrokerNode(i))
		}
		r, info, err := makeCerts(dir, names)
		if err != nil {
			return nil, err
		}
		c.clientTLS, c.tlsInfo = r, &info
	}
	if err := c.startEtcd(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = c.Close()
		}
	}()
	if opts.Secure {
		// With TLS the services authenticate every call (docs/operating.md,
		// "Security"): the admin client certificate's principal gets admin
		// on "*" here, straight in etcd, so strandctl needs no token.
		st := &auth.Store{KV: c.etcdCl, Schema: c.schema, Txn: auth.PlainTxn(c.etcdCl)}
		bctx, bcancel := context.WithTimeout(ctx, opts.ReadyTimeout)
		_, err := st.BootstrapPrincipal(bctx, tlsconfig.DefaultUser)
		bcancel()
		if err != nil {
			return nil, fmt.Errorf("devcluster: admin grant of %s: %w", tlsconfig.DefaultUser, err)
		}
	}
	etcdURL := c.EtcdEndpoints()[0]
	common := func(name string) []string {
		tls := []string{"--insecure"}
		if opts.Secure {
			tls = []string{"--certs-dir", c.nodeCertsDir(name)}
		}
		return append([]string{"--etcd", etcdURL, "--prefix", opts.Prefix}, tls...)
	}
	c.add(Controller, loopback(opts.PortBase+2), bins[ControllerBin], controllerArgs(opts, common(Controller)))
	c.add(Recoverer, loopback(opts.PortBase+3), bins[RecovererBin],
		append(append([]string{"--name", Recoverer, "--listen", loopback(opts.PortBase + 3)}, common(Recoverer)...), opts.RecovererArgs...))
	for i := 1; i <= opts.Brokers; i++ {
		node, addr := BrokerNode(i), loopback(opts.PortBase+10+i)
		args := append([]string{"--node", node, "--listen", addr, "--data-dir", filepath.Join(dir, node)}, common(node)...)
		if z := BrokerZone(opts.Zones, i); z != "" {
			args = append(args, "--zone", z)
		}
		c.add(node, addr, bins[BrokerBin], append(args, opts.BrokerArgs...))
	}
	procs := make([]*proc, len(c.order))
	for i, name := range c.order {
		c.mu.Lock()
		p, err := c.spawn(c.children[name])
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		procs[i] = p
	}
	ctx, cancel := context.WithTimeout(ctx, opts.ReadyTimeout)
	defer cancel()
	for i, name := range c.order {
		if err := c.waitReady(ctx, c.children[name], procs[i]); err != nil {
			return nil, err
		}
	}
	if opts.Control {
		if c.control, err = c.serveControl(); err != nil {
			return nil, err
		}
	}
	// A child that fails while the cluster starts fails the start; only
	// a cluster that came up is supervised.
	c.mu.Lock()
	c.supervise = opts.Supervise
	c.mu.Unlock()
	if err := c.writeInfo(); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

func fillDefaults(o *Options) {
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.Brokers == 0 {
		o.Brokers = DefaultBrokers
	}
	if o.PortBase == 0 {
		o.PortBase = DefaultPortBase
	}
	if o.Prefix == "" {
		o.Prefix = cluster.DefaultPrefix
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	o.Etcd = o.Etcd.WithDefaults()
}

func loopback(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// findBinaries looks for the service binaries in binDir, else next to the
// running executable, else on PATH.
func findBinaries(binDir string) (map[string]string, error) {
	out := make(map[string]string)
	var dirs []string
	if binDir != "" {
		dirs = []string{binDir}
	} else if exe, err := os.Executable(); err == nil {
		dirs = []string{filepath.Dir(exe)}
	}
	for _, name := range []string{BrokerBin, ControllerBin, RecovererBin} {
		found := ""
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				found = p
				break
			}
		}
		if found == "" && binDir == "" {
			if p, err := exec.LookPath(name); err == nil {
				found = p
			}
		}
		if found == "" {
			where := "next to strandctl or on PATH"
			if binDir != "" {
				where = "in " + binDir
			}
			return nil, fmt.Errorf("devcluster: %s not found %s (run `make build`, or pass --bin-dir)", name, where)
		}
		out[name] = found
	}
	return out, nil
}

func (c *Cluster) startEtcd() error {
	logPath := filepath.Join(c.opts.Dir, "logs", "etcd.log")
	zcfg := zap.NewProductionConfig()
	zcfg.Level = zap.NewAtomicLevelAt(zapcore.WarnLevel)
	zcfg.OutputPaths = []string{logPath}
	zcfg.ErrorOutputPaths = []string{logPath}
	zcfg.Sampling = nil
	logger, err := zcfg.Build()
	if err != nil {
		logger = zap.NewNop()
	}
	cfg := embed.NewConfig()
	cfg.Name = "strand-dev"
	cfg.Dir = filepath.Join(c.opts.Dir, "etcd")
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logger)
	clientURL := url.URL{Scheme: c.etcdScheme(), Host: loopback(c.opts.PortBase)}
	peerURL := url.URL{Scheme: "http", Host: loopback(c.opts.PortBase + 1)}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	var clientTLS *tls.Config
	if c.opts.Secure {
		// Clients of the embedded etcd present a certificate of the
		// cluster's CA: the children their node certificates, strandctl
		// the admin's. Its one member's peer port stays on loopback.
		nodeFiles := tlsconfig.NodeFiles(c.nodeCertsDir(etcdCertName))
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: nodeFiles.CertFile, KeyFile: nodeFiles.KeyFile,
			TrustedCAFile: nodeFiles.CAFile, ClientCertAuth: true}
		var err error
		if clientTLS, err = etcdcfg.FilesTLS(tlsconfig.Files{CAFile: c.tlsInfo.CA, CertFile: c.tlsInfo.Cert, KeyFile: c.tlsInfo.Key}); err != nil {
			return fmt.Errorf("devcluster: %w", err)
		}
	}
	// Compacted history and an explicit quota: without them every write
	// since the cluster was made stays in the database until the quota
	// stops all writes (docs/etcd.md).
	c.opts.Etcd.Apply(cfg)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("devcluster: start etcd on %s: %w", clientURL.Host, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("devcluster: etcd: %w", err)
	case <-time.After(c.opts.ReadyTimeout):
		e.Close()
		return fmt.Errorf("devcluster: etcd not ready after %v (see %s)", c.opts.ReadyTimeout, logPath)
	}
	c.etcd = e
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: clientTLS})
	if err != nil {
		return fmt.Errorf("devcluster: etcd client: %w", err)
	}
	c.etcdCl = cl
	return nil
}

// EtcdEndpoints are the embedded etcd's client URLs.
func (c *Cluster) EtcdEndpoints() []string {
	return []string{c.etcdScheme() + "://" + loopback(c.opts.PortBase)}
}

func (c *Cluster) etcdScheme() string {
	if c.opts.Secure {
		return "https"
	}
	return "http"
}

// Etcd is a client of the embedded etcd, owned by the cluster.
func (c *Cluster) Etcd() *clientv3.Client { return c.etcdCl }

// Dir is the cluster's data dir (absolute).
func (c *Cluster) Dir() string { return c.opts.Dir }

// Exits delivers children that exited without being asked to. It is
// buffered; events past the buffer are only logged.
func (c *Cluster) Exits() <-chan Exit { return c.exits }

// controllerArgs are the controller's flags: its name and listen address,
// the common flags, --replace-after when set, then the extra flags.
func controllerArgs(opts Options, common []string) []string {
	args := append([]string{"--name", Controller, "--listen", loopback(opts.PortBase + 2)}, common...)
	if opts.ReplaceAfter > 0 {
		args = append(args, "--replace-after", opts.ReplaceAfter.String())
	}
	return append(args, opts.ControllerArgs...)
}

func (c *Cluster) add(name, addr, bin string, args []string) {
	c.children[name] = &child{name: name, addr: addr, bin: bin, args: args}
	c.order = append(c.order, name)
}

func (c *Cluster) logPath(name string) string {
	return filepath.Join(c.opts.Dir, "logs", name+".log")
}

// logTail returns the last n lines of a log, for error messages (the dir may
// be a temp dir that is gone by the time anyone reads the message).
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// spawn starts a process of ch with its output in DIR/logs/<name>.log. The
// caller holds c.mu.
func (c *Cluster) spawn(ch *child) (*proc, error) {
	logPath := c.logPath(ch.name)
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("devcluster: %w", err)
	}
	fmt.Fprintf(f, "---- %s: %s %v\n", time.Now().Format(time.RFC3339Nano), ch.bin, ch.args)
	cmd := exec.Command(ch.bin, ch.args...)
	cmd.Env = append(os.Environ(), rpcserver.PeerTokenEnv+"="+c.peerToken)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own process group: a terminal's Ctrl-C reaches strandctl only,
		// which stops the children in order (controller first, so the
		// brokers going down does not start failovers).
		Setpgid: true,
		// If strandctl itself dies, the children go with it.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("devcluster: start %s: %w", ch.name, err)
	}
	p := &proc{cmd: cmd, log: f, done: make(chan struct{}), t0: time.Now()}
	ch.proc = p
	go c.wait(ch, p)
	return p, nil
}

// wait reaps a process, reports an unexpected exit and, on a supervised
// cluster, restarts the child.
func (c *Cluster) wait(ch *child, p *proc) {
	err := p.cmd.Wait()
	c.mu.Lock()
	p.err = err
	expected := p.stop
	_ = p.log.Close()
	close(p.done)
	restart := !expected && c.supervise && !c.closed && !ch.held
	var delay time.Duration
	if restart {
		delay = ch.nextBackoff(p.t0, time.Now())
		// Added under c.mu while not closed: Close, which sets closed
		// under c.mu, then waits for every restart it could miss.
		c.restarts.Add(1)
	}
	c.mu.Unlock()
	if expected {
		return
	}
	if err == nil {
		err = errors.New("exit status 0")
	}
	pid := p.cmd.Process.Pid
	if restart {
		fmt.Fprintf(c.opts.Log, "dev: %s (pid %d) exited (%v); restarting in %v\n", ch.name, pid, err, delay)
	} else {
		fmt.Fprintf(c.opts.Log, "dev: %s (pid %d) exited: %v; the rest keep running\n", ch.name, pid, err)
	}
	select {
	case c.exits <- Exit{Name: ch.name, PID: pid, Err: err}:
	default:
	}
	// Its pid is 0 in cluster.json from now on: nobody signals a pid the
	// system may give to another process.
	_ = c.writeInfo()
	if restart {
		c.restartAfter(ch, p, delay)
	}
}

// nextBackoff is the delay before the next supervised restart of ch, whose
// process ran from t0 to now: doubled after each quick exit, so a child
// that cannot start does not spin, and back to RestartMin once it had run a
// while. The caller holds c.mu.
func (ch *child) nextBackoff(t0, now time.Time) time.Duration {
	if ch.backoff == 0 || now.Sub(t0) >= RestartReset {
		ch.backoff = RestartMin
	} else {
		ch.backoff = min(2*ch.backoff, RestartMax)
	}
	return ch.backoff
}

// restartAfter starts ch again after delay, with the flags, environment and
// data dir it had, unless meanwhile the cluster closed, the child was
// stopped by Stop or started by Restart (its process is no longer
// dead). A start that fails is tried again with a longer back-off.
func (c *Cluster) restartAfter(ch *child, dead *proc, delay time.Duration) {
	defer c.restarts.Done()
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-t.C:
		}
		c.mu.Lock()
		if c.closed || ch.held || ch.proc != dead {
			c.mu.Unlock()
			return
		}
		_, err := c.spawn(ch)
		if err != nil {
			delay = ch.nextBackoff(time.Now(), time.Now())
		}
		c.mu.Unlock()
		if err == nil {
			// The new pid, for whoever reads cluster.json.
			_ = c.writeInfo()
			return
		}
		fmt.Fprintf(c.opts.Log, "dev: restarting %s: %v; trying again in %v\n", ch.name, err, delay)
		t.Reset(delay)
	}
}

// waitReady polls the child's health, and for a broker its registration in
// etcd, until both hold, its process p exits, or ctx ends.
func (c *Cluster) waitReady(ctx context.Context, ch *child, p *proc) error {
	d := rpcserver.Dialer{TLS: c.clientTLS}
	hc := grpchealth.NewClient(d.HTTPClient(), d.BaseURL(ch.addr))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if c.ready(ctx, hc, ch, p) {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("devcluster: %s exited while starting: %v; its log ends:\n%s", ch.name, p.err, logTail(c.logPath(ch.name), 15))
		case <-ctx.Done():
			return fmt.Errorf("devcluster: %s at %s not ready: %w; its log ends:\n%s", ch.name, ch.addr, ctx.Err(), logTail(c.logPath(ch.name), 15))
		case <-tick.C:
		}
	}
}

func (c *Cluster) ready(ctx context.Context, hc *grpchealth.Client, ch *child, p *proc) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	res, err := hc.Check(cctx, &grpchealth.CheckRequest{})
	if err != nil || res.Status != grpchealth.StatusServing {
		return false
	}
	if ch.name == Controller || ch.name == Recoverer {
		return true
	}
	// A broker is ready once its registration from this start is in
	// etcd: after a SIGKILL the last start's key lives on until its lease
	// expires, so the start time tells them apart.
	get, err := c.etcdCl.Get(cctx, c.schema.BrokerKey(ch.name))
	if err != nil || len(get.Kvs) == 0 {
		return false
	}
	info, err := cluster.Decode[cluster.BrokerInfo](get.Kvs[0].Value)
	return err == nil && info.Address == ch.addr && !info.StartTime.Before(p.t0.Add(-time.Second))
}

// Errors of the methods that name one child.
var (
	ErrUnknownNode = errors.New("devcluster: no such node")
	ErrRunning     = errors.New("devcluster: already running")
	ErrStopped     = errors.New("devcluster: already stopped")
	ErrClosed      = errors.New("devcluster: closed")
)

// Info describes the cluster as cluster.json does. A child that is not
// running has pid 0, so nobody signals a pid that may be reused.
func (c *Cluster) Info() Info {
	c.mu.Lock()
	defer c.mu.Unlock()
	info := Info{Etcd: c.EtcdEndpoints(), Prefix: c.opts.Prefix, PID: os.Getpid(), PeerTokenFile: c.tokenFile, TLS: c.tlsInfo}
	if c.control != nil {
		info.Control = c.control.addr
	}
	for _, name := range c.order {
		ch := c.children[name]
		pid := 0
		if ch.proc != nil && ch.proc.running() {
			pid = ch.proc.cmd.Process.Pid
		}
		switch name {
		case Controller:
			info.Controller, info.ControllerPID = ch.addr, pid
		case Recoverer:
			info.Recoverer, info.RecovererPID = ch.addr, pid
		default:
			info.Brokers = append(info.Brokers, BrokerInfo{Node: name, Address: ch.addr, PID: pid})
		}
	}
	return info
}

// writeInfo rewrites cluster.json, unless the cluster is closed: Close
// removes the file under infoMu after setting closed, so no write lands
// after the removal.
func (c *Cluster) writeInfo() error {
	c.infoMu.Lock()
	defer c.infoMu.Unlock()
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return writeInfo(c.opts.Dir, c.Info())
}

// child returns the named child; the caller holds c.mu.
func (c *Cluster) child(name string) (*child, error) {
	ch, ok := c.children[name]
	if !ok {
		return nil, fmt.Errorf("%w %q; the nodes are %s", ErrUnknownNode, name, strings.Join(c.order, ", "))
	}
	return ch, nil
}

// current returns the named child's last process (a restart replaces it).
func (c *Cluster) current(name string) (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, err := c.child(name)
	if err != nil {
		return nil, err
	}
	if ch.proc == nil {
		return nil, fmt.Errorf("devcluster: %s not started", name)
	}
	return ch.proc, nil
}

// PID returns the process id of the named process (0 if never started).
func (c *Cluster) PID(name string) int {
	p, err := c.current(name)
	if err != nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the named process has not exited.
func (c *Cluster) Running(name string) bool {
	p, err := c.current(name)
	return err == nil && p.running()
}

// Kill sends sig to the named process (SIGKILL, SIGSTOP, SIGTERM, SIGCONT…).
// The exit that follows is reported as unexpected, like any fault, and on a
// supervised cluster the child is restarted.
func (c *Cluster) Kill(name string, sig syscall.Signal) error {
	p, err := c.current(name)
	if err != nil {
		return err
	}
	return p.cmd.Process.Signal(sig)
}

// Wait blocks until the named process has exited or ctx ends.
func (c *Cluster) Wait(ctx context.Context, name string) error {
	p, err := c.current(name)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop stops the named child (SIGTERM, then SIGKILL after StopTimeout) and
// keeps it down, supervised or not, until Restart: what `strandctl dev
// stop` does. SIGTERM lets a broker shut down cleanly, revoking its lease,
// so its streams fail over at once rather than after the lease TTL. A child
// that is down already (killed on an unsupervised cluster, or waiting out a
// restart back-off) is only kept down.
func (c *Cluster) Stop(name string) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	ch, err := c.child(name)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if ch.held {
		c.mu.Unlock()
		return fmt.Errorf("%w: %s (start it with dev start %s)", ErrStopped, name, name)
	}
	ch.held = true
	p := ch.proc
	running := p != nil && p.running()
	if running {
		p.stop = true
	}
	c.mu.Unlock()
	if running {
		c.stopAll([]namedProc{{name, p}})
	}
	return c.writeInfo()
}

// Restart starts the named child again after it exited or was stopped
// (kill it first), waits until it is ready and rewrites cluster.json: what
// `strandctl dev start` does. Its flags, environment and data dir are those
// it had.
func (c *Cluster) Restart(ctx context.Context, name string) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	ch, err := c.child(name)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if ch.proc != nil && ch.proc.running() {
		pid := ch.proc.cmd.Process.Pid
		c.mu.Unlock()
		return fmt.Errorf("%w: %s (pid %d)", ErrRunning, name, pid)
	}
	// A supervised restart still waiting out its back-off sees a new
	// process and gives up.
	ch.held = false
	p, err := c.spawn(ch)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	if err := c.waitReady(ctx, ch, p); err != nil {
		return err
	}
	return c.writeInfo()
}

// Close stops the controller and recoverer, then the brokers (SIGTERM, then
// SIGKILL after StopTimeout), then etcd, and removes cluster.json. The data
// stays for the next start.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.quit)
	c.mu.Unlock()
	// No restart starts a process after this: each checks closed under
	// c.mu before it spawns, and those that did are among the children
	// collected below.
	c.restarts.Wait()
	if c.control != nil {
		c.control.close()
	}
	var leaders, brokers []namedProc
	c.mu.Lock()
	for _, name := range c.order {
		p := c.children[name].proc
		if p == nil {
			continue
		}
		p.stop = true
		if name == Controller || name == Recoverer {
			leaders = append(leaders, namedProc{name, p})
		} else {
			brokers = append(brokers, namedProc{name, p})
		}
	}
	c.mu.Unlock()
	c.infoMu.Lock()
	_ = os.Remove(filepath.Join(c.opts.Dir, InfoFile))
	c.infoMu.Unlock()
	var errs []error
	errs = append(errs, c.stopAll(leaders)...)
	errs = append(errs, c.stopAll(brokers)...)
	if c.etcdCl != nil {
		_ = c.etcdCl.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
		<-c.etcd.Server.StopNotify()
	}
	return errors.Join(errs...)
}

type namedProc struct {
	name string
	p    *proc
}

// stopAll sends SIGTERM to every process at once (and SIGCONT, in case one
// is stopped), waits up to StopTimeout, then SIGKILLs the rest.
func (c *Cluster) stopAll(procs []namedProc) []error {
	for _, np := range procs {
		_ = np.p.cmd.Process.Signal(syscall.SIGTERM)
		_ = np.p.cmd.Process.Signal(syscall.SIGCONT)
	}
	deadline := time.NewTimer(c.opts.StopTimeout)
	defer deadline.Stop()
	var errs []error
	for _, np := range procs {
		select {
		case <-np.p.done:
		case <-deadline.C:
			// Timer fired once: kill this and every later one still up.
			for _, rest := range procs {
				if rest.p.running() {
					_ = rest.p.cmd.Process.Kill()
					errs = append(errs, fmt.Errorf("devcluster: %s did not stop within %v; killed", rest.name, c.opts.StopTimeout))
				}
			}
			for _, rest := range procs {
				<-rest.p.done
			}
			return errs
		}
	}
	return errs
}
