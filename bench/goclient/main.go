// A Go load client for `python -m bench compare --client go`: Go's net/http and crypto/tls, the
// stack of the Ignition client (and of HyperShift's server), with the C client's arguments and
// JSON output (bench/loadclient.c), so that the two can be compared on the same targets.
//
// usage: goclient HOST PORT CAFILE|- SECONDS CONNECTIONS close|keepalive PATH [HEADER ...]
// close: a new connection and full TLS handshake per request (no session cache: Go resumes
// only with a ClientSessionCache), `Connection: close`; keepalive: CONNECTIONS connections
// reused. CAFILE "-": no certificate verification, as the C client.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type sample struct {
	at      float64 // seconds since the start, at completion
	latency float64 // ms
	ok      bool
}

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return -1
	}
	i := int(q * float64(len(sorted)))
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func main() {
	if len(os.Args) < 8 {
		fmt.Fprintf(os.Stderr, "usage: %s HOST PORT CAFILE SECONDS CONNECTIONS close|keepalive PATH [HEADER ...]\n", os.Args[0])
		os.Exit(2)
	}
	host, port, cafile := os.Args[1], os.Args[2], os.Args[3]
	seconds, _ := strconv.ParseFloat(os.Args[4], 64)
	connections, _ := strconv.Atoi(os.Args[5])
	keepalive := os.Args[6] == "keepalive"
	url := "https://" + host + ":" + port + os.Args[7]
	header := http.Header{}
	for _, h := range os.Args[8:] {
		name, value, _ := strings.Cut(h, ": ")
		header.Add(name, value)
	}
	config := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cafile == "-"}
	if sni := os.Getenv("LOADCLIENT_SNI"); sni != "" {
		config.ServerName = sni
	}
	if cafile != "-" {
		pem, err := os.ReadFile(cafile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cannot load CA %s: %v\n", cafile, err)
			os.Exit(2)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		config.RootCAs = pool
	}
	transport := &http.Transport{TLSClientConfig: config, DisableKeepAlives: !keepalive,
		MaxIdleConnsPerHost: connections, MaxConnsPerHost: connections, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 60 * time.Second}

	start := time.Now()
	deadline := start.Add(time.Duration(seconds * float64(time.Second)))
	var mu sync.Mutex
	var samples []sample
	var resumed, bytes, other int64
	var wg sync.WaitGroup
	for i := 0; i < connections; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				began := time.Now()
				request, _ := http.NewRequest("GET", url, nil)
				request.Header = header.Clone()
				request.Close = !keepalive
				response, err := client.Do(request)
				ok, n, again, status := false, int64(0), false, 0
				if err == nil {
					n, err = io.Copy(io.Discard, response.Body)
					response.Body.Close()
					status = response.StatusCode
					ok = err == nil && status == 200
					again = response.TLS != nil && response.TLS.DidResume
				}
				done := time.Now()
				mu.Lock()
				samples = append(samples, sample{done.Sub(start).Seconds(), float64(done.Sub(began).Microseconds()) / 1000, ok})
				bytes += n
				if again {
					resumed++
				}
				if err == nil && status != 200 {
					other++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	cpu := cpuSeconds()

	var latencies []float64
	perSecond := map[int][]float64{}
	perSecondErr := map[int]int64{}
	var okCount, errCount int64
	for _, s := range samples {
		second := int(s.at)
		if s.ok {
			okCount++
			latencies = append(latencies, s.latency)
			perSecond[second] = append(perSecond[second], s.latency)
		} else {
			errCount++
			perSecondErr[second]++
		}
	}
	sort.Float64s(latencies)
	timeline := [][]any{}
	for s := 0; s <= int(elapsed); s++ {
		l := perSecond[s]
		sort.Float64s(l)
		timeline = append(timeline, []any{s, len(l), perSecondErr[s], percentile(l, 0.5), percentile(l, 0.99)})
	}
	out := map[string]any{"elapsed_s": elapsed, "requests": okCount, "errors": errCount, "status_200": okCount,
		"status_other": other, "resumed_sessions": resumed, "bytes": bytes, "rps": float64(okCount) / elapsed,
		"p50_ms": percentile(latencies, 0.5), "p99_ms": percentile(latencies, 0.99), "client_cpu_s": cpu,
		"client_cpu_share": cpu / elapsed, "retries": 0, "permanent_failures": 0, "unfinished": 0, "timeline": timeline}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
