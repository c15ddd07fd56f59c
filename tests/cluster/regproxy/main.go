// tessera-regproxy: a stand-in for the kubelet-facing half of a registrar, for
// tests/cluster only (TESSERA_REGPROXY=1 in tessera-up.sh).
//
// Why: the kubelet (1.34.4, 1.37.2: pkg/kubelet/pluginmanager/operationexecutor
// dial()) calls GetInfo on a registration socket with grpc.DialContext(<socket path>),
// so grpc-go sends the percent-encoded socket path as the HTTP/2 :authority
// ("%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F...-reg.sock"). Tessera serves its
// registration socket with tonic, whose h2 server rejects that authority ("malformed
// headers: malformed authority ...: invalid authority") with RST_STREAM PROTOCOL_ERROR:
// the kubelet never registers the plugin. Until the plugin handles it, this proxy lets
// the rest of the path (kubelet -> DRA socket, whose client uses "unix:" + endpoint and
// sends "localhost") be tested against the real kubelet.
//
// It watches -from (the directory given to the plugin as --plugin-registry-dir) and, for
// each registration socket there, serves one of the same name in -to (the kubelet's
// plugins_registry) with Go gRPC, forwarding GetInfo and NotifyRegistrationStatus to the
// plugin's socket over a "unix:" target (authority "localhost"). Each call is logged.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type forwarder struct {
	registerapi.UnimplementedRegistrationServer
	name   string
	client registerapi.RegistrationClient
}

func (f *forwarder) GetInfo(ctx context.Context, r *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	info, err := f.client.GetInfo(ctx, r)
	log.Printf("%s: GetInfo -> %v, err %v", f.name, info, err)
	return info, err
}

func (f *forwarder) NotifyRegistrationStatus(ctx context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	resp, err := f.client.NotifyRegistrationStatus(ctx, s)
	log.Printf("%s: NotifyRegistrationStatus(registered=%v, error=%q) -> err %v", f.name, s.PluginRegistered, s.Error, err)
	return resp, err
}

type proxied struct {
	server *grpc.Server
	conn   *grpc.ClientConn
	to     string
}

func main() {
	from := flag.String("from", "", "directory the plugin creates its registration sockets in")
	to := flag.String("to", "", "the kubelet's plugins_registry directory")
	flag.Parse()
	if *from == "" || *to == "" {
		log.Fatal("usage: tessera-regproxy -from DIR -to KUBELET_PLUGINS_REGISTRY")
	}
	live := map[string]*proxied{}
	failed := map[string]bool{} // logged once, not retried while the socket stays
	for {
		entries, _ := os.ReadDir(*from)
		seen := map[string]bool{}
		for _, e := range entries {
			name := e.Name()
			if e.Type()&os.ModeSocket == 0 || !strings.HasSuffix(name, ".sock") {
				continue
			}
			seen[name] = true
			if live[name] != nil || failed[name] {
				continue
			}
			src := filepath.Join(*from, name)
			conn, err := grpc.NewClient("unix:"+src, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				log.Printf("%s: %v", name, err)
				continue
			}
			dst := filepath.Join(*to, name)
			_ = os.Remove(dst)
			l, err := net.Listen("unix", dst)
			if err != nil {
				log.Printf("%s: listen %s: %v (given up until the plugin's socket is replaced)", name, dst, err)
				failed[name] = true
				conn.Close()
				continue
			}
			s := grpc.NewServer()
			registerapi.RegisterRegistrationServer(s, &forwarder{name: name, client: registerapi.NewRegistrationClient(conn)})
			go s.Serve(l)
			live[name] = &proxied{server: s, conn: conn, to: dst}
			log.Printf("%s: serving %s for %s", name, dst, src)
		}
		for name := range failed {
			if !seen[name] {
				delete(failed, name)
			}
		}
		for name, p := range live {
			if !seen[name] {
				p.server.Stop()
				p.conn.Close()
				_ = os.Remove(p.to)
				delete(live, name)
				log.Printf("%s: gone from %s, removed %s", name, *from, p.to)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}
