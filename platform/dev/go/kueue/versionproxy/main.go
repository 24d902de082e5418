// Command versionproxy stands between Kueue and the development API server: it forwards every
// request unchanged and answers GET /version itself with the release devcluster built.
//
// kube-apiserver built from the Go module proxy carries no version stamp (its /version says
// "v0.0.0-master+$Format:%H$", the placeholder that release builds replace through -ldflags),
// and Kueue refuses to start on a server version it cannot parse. The proxy listens on
// loopback without TLS and signs in upstream with the client certificate it is given.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (plain HTTP)")
	upstream := flag.String("upstream", "", "the API server's URL")
	caFile := flag.String("ca", "", "the API server's CA certificate")
	certFile := flag.String("cert", "", "client certificate")
	keyFile := flag.String("key", "", "client key")
	gitVersion := flag.String("git-version", "", "the release to report, e.g. v1.37.2")
	flag.Parse()

	target, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("upstream: %v", err)
	}
	pem, err := os.ReadFile(*caFile)
	if err != nil {
		log.Fatalf("ca: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatalf("client certificate: %v", err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1 // watches stream event by event
	proxy.Transport = &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 100,
	}
	parts := strings.SplitN(strings.TrimPrefix(*gitVersion, "v"), ".", 3)
	if len(parts) < 2 {
		log.Fatalf("git-version %q is not vMAJOR.MINOR.PATCH", *gitVersion)
	}
	version, _ := json.Marshal(map[string]string{
		"major":        parts[0],
		"minor":        parts[1],
		"gitVersion":   *gitVersion,
		"gitCommit":    "",
		"gitTreeState": "clean",
		"buildDate":    "1970-01-01T00:00:00Z",
		"goVersion":    "",
		"compiler":     "gc",
		"platform":     "linux/amd64",
	})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/version" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(version)
			return
		}
		proxy.ServeHTTP(w, r)
	})
	log.Fatal(http.ListenAndServe(*listen, handler))
}
