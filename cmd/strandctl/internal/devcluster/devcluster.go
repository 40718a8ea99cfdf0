// Package devcluster runs a local Strand cluster as processes: an embedded
// etcd in this process, and strand-controller, strand-recoverer and N
// strand-broker children on loopback (docs/operating.md, "strandctl dev").
// `strandctl dev`, `strandctl bench` and the CLI smoke test share it, so the
// cluster they exercise is the one a user runs.
package devcluster

import (
	"context"
	"crypto/rand"
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
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/strandhq/strand/client"
	"github.com/strandhq/strand/internal/cluster"
	"github.com/strandhq/strand/internal/etcdcfg"
	"github.com/strandhq/strand/internal/rpcserver"
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
	// BrokerArgs, ControllerArgs and RecovererArgs are extra flags.
	BrokerArgs     []string
	ControllerArgs []string
	RecovererArgs  []string
	// Etcd is the embedded etcd's auto-compaction and quota; zero fields
	// take etcdcfg's defaults (docs/etcd.md).
	Etcd etcdcfg.Options
}

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
	etcd      *embed.Etcd
	etcdCl    *clientv3.Client
	schema    cluster.Schema
	exits     chan Exit

	mu       sync.Mutex
	children map[string]*child
	order    []string // controller, recoverer, broker-1..N
	closed   bool
}

// child is one service process; a restart replaces it with a new child.
type child struct {
	name string
	addr string
	bin  string
	args []string
	log  *os.File
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
	stop bool          // stopping was asked for; the exit is expected
	t0   time.Time
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
	if info, err := ReadInfo(dir); err == nil && info.PID > 0 && info.PID != os.Getpid() && syscall.Kill(info.PID, 0) == nil {
		return nil, fmt.Errorf("devcluster: a cluster already runs from %s (strandctl pid %d); stop it or use another data dir", dir, info.PID)
	}
	_ = os.Remove(filepath.Join(dir, InfoFile))
	bins, err := findBinaries(opts.BinDir)
	if err != nil {
		return nil, err
	}
	// The children share a peer token (Follow and Seal are for peers
	// only): the caller's, else a fresh one for this start.
	peerToken := rpcserver.PeerToken()
	if peerToken == "" {
		peerToken = rand.Text()
	}
	c := &Cluster{
		opts:      opts,
		peerToken: peerToken,
		schema:    cluster.NewSchema(opts.Prefix),
		exits:     make(chan Exit, 16),
		children:  make(map[string]*child),
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
	etcdURL := c.EtcdEndpoints()[0]
	common := []string{"--etcd", etcdURL, "--prefix", opts.Prefix}
	c.add(Controller, loopback(opts.PortBase+2), bins[ControllerBin],
		append(append([]string{"--name", Controller, "--listen", loopback(opts.PortBase + 2)}, common...), opts.ControllerArgs...))
	c.add(Recoverer, loopback(opts.PortBase+3), bins[RecovererBin],
		append(append([]string{"--name", Recoverer, "--listen", loopback(opts.PortBase + 3)}, common...), opts.RecovererArgs...))
	for i := 1; i <= opts.Brokers; i++ {
		node, addr := BrokerNode(i), loopback(opts.PortBase+10+i)
		c.add(node, addr, bins[BrokerBin],
			append(append([]string{"--node", node, "--listen", addr, "--data-dir", filepath.Join(dir, node)}, common...), opts.BrokerArgs...))
	}
	for _, name := range c.order {
		if err := c.spawn(c.children[name]); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.ReadyTimeout)
	defer cancel()
	for _, name := range c.order {
		if err := c.waitReady(ctx, c.children[name], c.children[name].done); err != nil {
			return nil, err
		}
	}
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
	clientURL := url.URL{Scheme: "http", Host: loopback(c.opts.PortBase)}
	peerURL := url.URL{Scheme: "http", Host: loopback(c.opts.PortBase + 1)}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
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
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("devcluster: etcd client: %w", err)
	}
	c.etcdCl = cl
	return nil
}

// EtcdEndpoints are the embedded etcd's client URLs.
func (c *Cluster) EtcdEndpoints() []string {
	return []string{"http://" + loopback(c.opts.PortBase)}
}

// Etcd is a client of the embedded etcd, owned by the cluster.
func (c *Cluster) Etcd() *clientv3.Client { return c.etcdCl }

// Dir is the cluster's data dir (absolute).
func (c *Cluster) Dir() string { return c.opts.Dir }

// Exits delivers children that exited without being asked to. It is
// buffered; events past the buffer are only logged.
func (c *Cluster) Exits() <-chan Exit { return c.exits }

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

// spawn starts ch's process with its output in DIR/logs/<name>.log.
func (c *Cluster) spawn(ch *child) error {
	logPath := c.logPath(ch.name)
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("devcluster: %w", err)
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
		return fmt.Errorf("devcluster: start %s: %w", ch.name, err)
	}
	ch.cmd, ch.log, ch.done, ch.err, ch.stop, ch.t0 = cmd, f, make(chan struct{}), nil, false, time.Now()
	go c.wait(ch, cmd, ch.done)
	return nil
}

// wait reaps a child and reports an unexpected exit.
func (c *Cluster) wait(ch *child, cmd *exec.Cmd, done chan struct{}) {
	err := cmd.Wait()
	c.mu.Lock()
	ch.err = err
	expected := ch.stop
	_ = ch.log.Close()
	close(done)
	c.mu.Unlock()
	if expected {
		return
	}
	if err == nil {
		err = errors.New("exit status 0")
	}
	fmt.Fprintf(c.opts.Log, "dev: %s (pid %d) exited: %v; the rest keep running\n", ch.name, cmd.Process.Pid, err)
	select {
	case c.exits <- Exit{Name: ch.name, PID: cmd.Process.Pid, Err: err}:
	default:
	}
}

// waitReady polls the child's health, and for a broker its registration in
// etcd, until both hold, the child exits, or ctx ends.
func (c *Cluster) waitReady(ctx context.Context, ch *child, done <-chan struct{}) error {
	hc := grpchealth.NewClient(rpcserver.HTTPClient(), rpcserver.BaseURL(ch.addr))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if c.ready(ctx, hc, ch) {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("devcluster: %s exited while starting: %v; its log ends:\n%s", ch.name, ch.err, logTail(c.logPath(ch.name), 15))
		case <-ctx.Done():
			return fmt.Errorf("devcluster: %s at %s not ready: %w; its log ends:\n%s", ch.name, ch.addr, ctx.Err(), logTail(c.logPath(ch.name), 15))
		case <-tick.C:
		}
	}
}

func (c *Cluster) ready(ctx context.Context, hc *grpchealth.Client, ch *child) bool {
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
	return err == nil && info.Address == ch.addr && !info.StartTime.Before(ch.t0.Add(-time.Second))
}

// Info describes the cluster as cluster.json does.
func (c *Cluster) Info() Info {
	c.mu.Lock()
	defer c.mu.Unlock()
	info := Info{Etcd: c.EtcdEndpoints(), Prefix: c.opts.Prefix, PID: os.Getpid()}
	for _, name := range c.order {
		ch := c.children[name]
		pid := 0
		if ch.cmd != nil {
			pid = ch.cmd.Process.Pid
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

func (c *Cluster) writeInfo() error { return writeInfo(c.opts.Dir, c.Info()) }

func (c *Cluster) get(name string) (*child, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.children[name]
	if !ok {
		return nil, fmt.Errorf("devcluster: no process %q", name)
	}
	return ch, nil
}

// current returns the named child's process and exit channel as of now (a
// restart replaces both).
func (c *Cluster) current(name string) (*exec.Cmd, chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.children[name]
	if !ok {
		return nil, nil, fmt.Errorf("devcluster: no process %q", name)
	}
	if ch.cmd == nil {
		return nil, nil, fmt.Errorf("devcluster: %s not started", name)
	}
	return ch.cmd, ch.done, nil
}

// PID returns the process id of the named process (0 if never started).
func (c *Cluster) PID(name string) int {
	cmd, _, err := c.current(name)
	if err != nil {
		return 0
	}
	return cmd.Process.Pid
}

// Running reports whether the named process has not exited.
func (c *Cluster) Running(name string) bool {
	_, done, err := c.current(name)
	if err != nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Kill sends sig to the named process (SIGKILL, SIGSTOP, SIGTERM, SIGCONT…).
// The exit that follows is reported as unexpected, like any fault.
func (c *Cluster) Kill(name string, sig syscall.Signal) error {
	cmd, _, err := c.current(name)
	if err != nil {
		return err
	}
	return cmd.Process.Signal(sig)
}

// Wait blocks until the named process has exited or ctx ends.
func (c *Cluster) Wait(ctx context.Context, name string) error {
	_, done, err := c.current(name)
	if err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Restart starts the named process again after it exited (kill it first),
// waits until it is ready and rewrites cluster.json.
func (c *Cluster) Restart(ctx context.Context, name string) error {
	ch, err := c.get(name)
	if err != nil {
		return err
	}
	if c.Running(name) {
		return fmt.Errorf("devcluster: %s is still running (pid %d); kill it first", name, c.PID(name))
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errors.New("devcluster: closed")
	}
	err = c.spawn(ch)
	done := ch.done
	c.mu.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	if err := c.waitReady(ctx, ch, done); err != nil {
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
	var leaders, brokers []*child
	for _, name := range c.order {
		ch := c.children[name]
		if ch.cmd == nil {
			continue
		}
		ch.stop = true
		if name == Controller || name == Recoverer {
			leaders = append(leaders, ch)
		} else {
			brokers = append(brokers, ch)
		}
	}
	c.mu.Unlock()
	_ = os.Remove(filepath.Join(c.opts.Dir, InfoFile))
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

// stopAll sends SIGTERM to every child at once (and SIGCONT, in case one is
// stopped), waits up to StopTimeout, then SIGKILLs the rest.
func (c *Cluster) stopAll(children []*child) []error {
	for _, ch := range children {
		_ = ch.cmd.Process.Signal(syscall.SIGTERM)
		_ = ch.cmd.Process.Signal(syscall.SIGCONT)
	}
	deadline := time.NewTimer(c.opts.StopTimeout)
	defer deadline.Stop()
	var errs []error
	for _, ch := range children {
		select {
		case <-ch.done:
		case <-deadline.C:
			// Timer fired once: kill this and every later one still up.
			for _, rest := range children {
				select {
				case <-rest.done:
				default:
					_ = rest.cmd.Process.Kill()
					errs = append(errs, fmt.Errorf("devcluster: %s did not stop within %v; killed", rest.name, c.opts.StopTimeout))
				}
			}
			for _, rest := range children {
				<-rest.done
			}
			return errs
		}
	}
	return errs
}
