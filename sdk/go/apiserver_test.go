package backpressure

// The TokenReview client against a real kube-apiserver (with etcd), built by the repository's
// tools/k8s/build.sh (a no-op once cached) or found in $BP_K8S_BIN.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func k8sBinDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("BP_K8S_BIN"); d != "" {
		return d
	}
	script := filepath.Join("..", "..", "tools", "k8s", "build.sh")
	if _, err := os.Stat(script); err != nil {
		t.Skip("no kube-apiserver: set BP_K8S_BIN (tools/k8s/build.sh is not in this tree)")
	}
	out, err := exec.Command("bash", script).Output()
	if err != nil {
		t.Fatalf("tools/k8s/build.sh: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type testPKI struct {
	caPEM      []byte
	client     tls.Certificate
	dir        string
	serverCert string
	serverKey  string
	caFile     string
	saKey      string
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newPKI(t *testing.T, dir string) testPKI {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sdk-go-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	issue := func(serial int64, tmpl *x509.Certificate) ([]byte, *ecdsa.PrivateKey) {
		k := key()
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	p := testPKI{dir: dir, caFile: filepath.Join(dir, "ca.crt"), serverCert: filepath.Join(dir, "server.crt"),
		serverKey: filepath.Join(dir, "server.key"), saKey: filepath.Join(dir, "sa.key")}
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	p.caPEM, _ = os.ReadFile(p.caFile)
	serverDER, serverKey := issue(2, &x509.Certificate{
		Subject: pkix.Name{CommonName: "kube-apiserver"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames: []string{"localhost"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	writePEM(t, p.serverCert, "CERTIFICATE", serverDER)
	skDER, _ := x509.MarshalECPrivateKey(serverKey)
	writePEM(t, p.serverKey, "EC PRIVATE KEY", skDER)
	clientDER, clientKey := issue(3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	p.client = tls.Certificate{Certificate: [][]byte{clientDER}, PrivateKey: clientKey}
	saDER, _ := x509.MarshalECPrivateKey(key())
	writePEM(t, p.saKey, "EC PRIVATE KEY", saDER)
	return p
}

// process is a child started by startProcess; exited is closed when it has exited.
type process struct {
	log    string
	exited chan struct{}
}

// tail is the end of the process's log, for a failure message.
func (p process) tail() string {
	text, _ := os.ReadFile(p.log)
	if len(text) > 4000 {
		text = text[len(text)-4000:]
	}
	return string(text)
}

func (p process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func startProcess(t *testing.T, dir, name, bin string, args ...string) process {
	t.Helper()
	path := filepath.Join(dir, name+".log")
	log, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := process{log: path, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		log.Close()
	})
	return p
}

// kube is an admin client of the test API server.
type kube struct {
	url    string
	client *http.Client
}

func (k kube) do(t *testing.T, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(mustJSON(t, body))
	}
	req, err := http.NewRequest(method, k.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func (k kube) create(t *testing.T, path string, body any) []byte {
	t.Helper()
	status, data := k.do(t, "POST", path, body)
	if status/100 != 2 {
		t.Fatalf("POST %s: %d %s", path, status, data)
	}
	return data
}

// token requests a token of ServiceAccount ns/name for audiences (none: the API server's).
func (k kube) token(t *testing.T, ns, name string, audiences ...string) string {
	t.Helper()
	spec := map[string]any{"expirationSeconds": 600}
	if len(audiences) > 0 {
		spec["audiences"] = audiences
	}
	data := k.create(t, fmt.Sprintf("/api/v1/namespaces/%s/serviceaccounts/%s/token", ns, name),
		map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	if err := json.Unmarshal(data, &tr); err != nil || tr.Status.Token == "" {
		t.Fatalf("TokenRequest: %v %s", err, data)
	}
	return tr.Status.Token
}

// startAPIServer starts etcd and a kube-apiserver on free ports. A port picked free can be
// taken by another process before the child binds it, so a child that exits before it is
// ready is started again on new ports (three attempts), and a failure shows both logs.
func startAPIServer(t *testing.T) (kube, testPKI) {
	t.Helper()
	bin := k8sBinDir(t)
	var failures []string
	for attempt := 1; attempt <= 3; attempt++ {
		dir := t.TempDir()
		pki := newPKI(t, dir)
		k, err := tryAPIServer(t, bin, dir, pki)
		if err == nil {
			return k, pki
		}
		failures = append(failures, fmt.Sprintf("attempt %d: %v", attempt, err))
	}
	t.Fatalf("no kube-apiserver:\n%s", strings.Join(failures, "\n"))
	return kube{}, testPKI{}
}

func tryAPIServer(t *testing.T, bin, dir string, pki testPKI) (kube, error) {
	t.Helper()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	etcd := startProcess(t, dir, "etcd", filepath.Join(bin, "etcd"),
		"--data-dir="+filepath.Join(dir, "etcd"), "--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", freePort(t)), "--unsafe-no-fsync", "--log-level=warn")
	plain := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := plain.Get(etcdURL + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if !etcd.running() || time.Now().After(deadline) {
			return kube{}, fmt.Errorf("etcd not healthy (running: %v); its log:\n%s", etcd.running(), etcd.tail())
		}
	}
	port := freePort(t)
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	apiserver := startProcess(t, dir, "kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port), "--cert-dir="+filepath.Join(dir, "certs"),
		"--tls-cert-file="+pki.serverCert, "--tls-private-key-file="+pki.serverKey, "--client-ca-file="+pki.caFile,
		"--authorization-mode=RBAC", "--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer="+url, "--service-account-key-file="+pki.saKey,
		"--service-account-signing-key-file="+pki.saKey, "--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false", "--profiling=false", "--v=0")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pki.caPEM)
	k := kube{url: url, client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pki.client}},
	}}}
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		status, body := k.do(t, "GET", "/readyz", nil)
		if status == 200 {
			return k, nil
		}
		if !apiserver.running() || !etcd.running() || time.Now().After(deadline) {
			return kube{}, fmt.Errorf("kube-apiserver not ready (%d %s; running: %v, etcd running: %v); its log:\n%s\netcd's log:\n%s",
				status, body, apiserver.running(), etcd.running(), apiserver.tail(), etcd.tail())
		}
	}
}

func TestTokenReviewAgainstARealAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	k, pki := startAPIServer(t)
	for _, ns := range []string{"bp-system", "shop"} {
		k.create(t, "/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]string{"name": ns}})
	}
	for _, sa := range [][2]string{{"bp-system", "backpressure-operator"}, {"bp-system", "someone-else"}, {"shop", "export"}} {
		k.create(t, "/api/v1/namespaces/"+sa[0]+"/serviceaccounts", map[string]any{
			"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]string{"name": sa[1]}})
	}
	// The worker's own credentials, first without the right to review tokens.
	workerToken := k.token(t, "shop", "export")
	api := APIServerConfig{URL: k.url, CAPEM: pki.caPEM, Token: workerToken}
	v, err := NewTokenReviewVerifier(api, "shop", "export")
	if err != nil {
		t.Fatal(err)
	}
	opToken := k.token(t, "bp-system", "backpressure-operator", PushAudience("shop", "export"))
	var unavailable *UnavailableError
	if _, err := v.Verify(t.Context(), opToken); !errors.As(err, &unavailable) {
		t.Fatalf("no RBAC for TokenReview must be 503, got %T %v", err, err)
	}
	k.create(t, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]string{"name": "export-auth-delegator"},
		"roleRef":  map[string]string{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
		"subjects": []map[string]string{{"kind": "ServiceAccount", "name": "export", "namespace": "shop"}},
	})
	var id Identity
	deadline := time.Now().Add(30 * time.Second)
	for {
		// RBAC reaches the authorizer's cache within a moment.
		id, err = v.Verify(t.Context(), opToken)
		if err == nil || !errors.As(err, &unavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	operator := ServiceAccountUsername("bp-system", "backpressure-operator")
	if err != nil || id.Username != operator {
		t.Fatalf("%v %+v", err, id)
	}
	var unauth *UnauthenticatedError
	// Another target's audience: refused locally.
	other := k.token(t, "bp-system", "backpressure-operator", PushAudience("shop", "export-2"))
	if _, err := v.Verify(t.Context(), other); !errors.As(err, &unauth) {
		t.Fatalf("%T %v", err, err)
	}
	// Our audience in a forged token (not signed by the API server): refused by the review.
	parts := strings.Split(opToken, ".")
	forged := parts[0] + "." + parts[1] + ".Zm9yZ2Vk"
	if _, err := v.Verify(t.Context(), forged); !errors.As(err, &unauth) {
		t.Fatalf("%T %v", err, err)
	}
	if _, err := v.Verify(t.Context(), forged); !errors.As(err, &unauth) || !strings.Contains(err.Error(), "within the last seconds") {
		t.Fatalf("negative cache: %v", err)
	}

	// End to end: the admin endpoint over HTTP with the real verifier.
	state, gate, metrics := newState(t)
	admin := NewAdmin(state, metrics).WithVerifier(v, operator)
	srv := httptest.NewServer(admin)
	defer srv.Close()
	push := func(token string, cfg WorkerConfig) int {
		req, _ := http.NewRequestWithContext(context.Background(), "PUT", srv.URL+ConfigPath, bytes.NewReader(mustJSON(t, cfg)))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	someone := k.token(t, "bp-system", "someone-else", PushAudience("shop", "export"))
	if s := push(someone, config(1, 3)); s != 403 {
		t.Fatal("another identity:", s)
	}
	if s := push(other, config(1, 3)); s != 401 {
		t.Fatal("another audience:", s)
	}
	if s := push(opToken, config(1, 3)); s != 200 || gate.Snapshot().Limit != 3 {
		t.Fatal("the operator's push:", s)
	}

	// The example worker as a conformance harness starts it: explicit API server credentials
	// from the environment, pushes reviewed by this API server, clean exit on SIGTERM.
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(workerToken), 0o600); err != nil {
		t.Fatal(err)
	}
	worker, addr := startExampleWorker(t, dir, []string{
		"BP_WORKLOAD=export", "BP_NAMESPACE=shop", "BP_ADMIN_ADDR=127.0.0.1:0",
		"BP_ALLOWED_IDENTITIES=" + operator, "BP_CONFORMANCE_HOOK=true",
		"BP_KUBE_API_URL=" + k.url, "BP_KUBE_CA_FILE=" + pki.caFile, "BP_KUBE_TOKEN_FILE=" + tokenFile,
	})
	pushTo := func(token string, cfg WorkerConfig) (int, string) {
		req, _ := http.NewRequest("PUT", "http://"+addr+ConfigPath, bytes.NewReader(mustJSON(t, cfg)))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if s, body := pushTo(someone, config(2, 4)); s != 403 {
		t.Fatal("example worker, another identity:", s, body)
	}
	want := config(2, 4)
	if s, body := pushTo(opToken, want); s != 200 || !strings.Contains(body, want.Hash) {
		t.Fatal("example worker, the operator's push:", s, body)
	}
	if err := worker.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- worker.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("example worker after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("example worker still running 15 s after SIGTERM")
	}
}

// startExampleWorker builds examples/worker and starts it with env (and PATH) only; it
// returns once the admin port listens.
func startExampleWorker(t *testing.T, dir string, env []string) (*exec.Cmd, string) {
	t.Helper()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	bin := filepath.Join(dir, "example-worker")
	if out, err := exec.Command(goTool, "build", "-o", bin, "./examples/worker").CombinedOutput(); err != nil {
		t.Fatalf("building the example: %v\n%s", err, out)
	}
	logPath := filepath.Join(dir, "example-worker.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		log.Close()
	})
	listening := regexp.MustCompile(`admin server listening addr=(\S+)`)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		text, _ := os.ReadFile(logPath)
		if m := listening.FindSubmatch(text); m != nil {
			return cmd, string(m[1])
		}
	}
	text, _ := os.ReadFile(logPath)
	t.Fatalf("the example worker did not listen:\n%s", text)
	return nil, ""
}
