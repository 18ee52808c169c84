// redfish-proxy: a counting reverse proxy in front of metal-operator's Redfish mocks, for the
// test bed. One process serves every mock, each on its own loopback port:
//
//	redfish-proxy -log FILE NAME,LISTEN,UPSTREAM[,OLD=NEW...] ...
//
// Every request that is not a GET or HEAD is appended to FILE as one JSON line:
//
//	{"time":"...","mock":"bmc-0","method":"POST","path":"/redfish/v1/Systems/X/Actions/ComputerSystem.Reset",
//	 "body":"{\"ResetType\":\"On\"}","status":202,"change":true}
//
// "change" is false only for session log-in/log-out (SessionService), which touch no machine;
// every other write (reset actions, boot-override and BIOS/BMC settings PATCHes, accounts,
// event subscriptions) counts as a change of the machine.
//
// Each OLD=NEW pair is replaced in the mock's response bodies (and NEW=OLD in request bodies):
// the mock serves one fixed system, so without this every mock would report the same system
// and manager UUIDs.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type mock struct {
	name     string
	listen   string
	upstream *url.URL
	rewrites [][2]string // response: OLD -> NEW
}

type entry struct {
	Time   string `json:"time"`
	Mock   string `json:"mock"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Body   string `json:"body"`
	Status int    `json:"status"`
	Change bool   `json:"change"`
}

const maxLoggedBody = 4096

var (
	logMu   sync.Mutex
	logFile *os.File
)

func record(e entry) {
	line, err := json.Marshal(e)
	if err != nil {
		log.Printf("encode log entry: %v", err)
		return
	}
	logMu.Lock()
	defer logMu.Unlock()
	if _, err := logFile.Write(append(line, '\n')); err != nil {
		log.Printf("write %s: %v", logFile.Name(), err)
	}
}

func parseMock(arg string) (mock, error) {
	parts := strings.Split(arg, ",")
	if len(parts) < 3 {
		return mock{}, fmt.Errorf("%q: want NAME,LISTEN,UPSTREAM[,OLD=NEW...]", arg)
	}
	up, err := url.Parse("http://" + parts[2])
	if err != nil {
		return mock{}, fmt.Errorf("%q: upstream: %v", arg, err)
	}
	m := mock{name: parts[0], listen: parts[1], upstream: up}
	for _, p := range parts[3:] {
		from, to, ok := strings.Cut(p, "=")
		if !ok || from == "" {
			return mock{}, fmt.Errorf("%q: rewrite %q is not OLD=NEW", arg, p)
		}
		m.rewrites = append(m.rewrites, [2]string{from, to})
	}
	return m, nil
}

func replaceAll(b []byte, pairs [][2]string, reverse bool) []byte {
	for _, p := range pairs {
		from, to := p[0], p[1]
		if reverse {
			from, to = to, from
		}
		b = bytes.ReplaceAll(b, []byte(from), []byte(to))
	}
	return b
}

func handler(m mock) http.Handler {
	proxy := httputil.NewSingleHostReverseProxy(m.upstream)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if len(m.rewrites) == 0 || resp.Body == nil {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return err
		}
		body = replaceAll(body, m.rewrites, false)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			proxy.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			http.Error(w, "cannot read request body", http.StatusBadRequest)
			return
		}
		body = replaceAll(body, m.rewrites, true)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		proxy.ServeHTTP(rec, r)
		logged := string(body)
		if len(logged) > maxLoggedBody {
			logged = logged[:maxLoggedBody]
		}
		record(entry{
			Time:   time.Now().UTC().Format(time.RFC3339Nano),
			Mock:   m.name,
			Method: r.Method,
			Path:   r.URL.Path,
			Body:   logged,
			Status: rec.status,
			Change: !strings.HasPrefix(r.URL.Path, "/redfish/v1/SessionService"),
		})
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func main() {
	logPath := flag.String("log", "", "file to append one JSON line per non-GET request to")
	flag.Parse()
	if *logPath == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: redfish-proxy -log FILE NAME,LISTEN,UPSTREAM[,OLD=NEW...] ...")
		os.Exit(2)
	}
	var err error
	logFile, err = os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatalf("open %s: %v", *logPath, err)
	}
	servers := make([]*http.Server, 0, flag.NArg())
	errs := make(chan error, flag.NArg())
	for _, arg := range flag.Args() {
		m, err := parseMock(arg)
		if err != nil {
			log.Fatal(err)
		}
		srv := &http.Server{Addr: m.listen, Handler: handler(m), ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		go func() { errs <- srv.ListenAndServe() }()
		log.Printf("%s: %s -> %s", m.name, m.listen, m.upstream.Host)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err := <-errs:
		log.Fatalf("listen: %v", err)
	case s := <-stop:
		log.Printf("%v: stopping", s)
		for _, srv := range servers {
			_ = srv.Close()
		}
	}
}
