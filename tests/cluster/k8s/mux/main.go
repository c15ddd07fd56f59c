// hyperkube: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
// kubectl in one binary (one link instead of five), for the single-node test cluster.
// The component is chosen by the name the binary is run as (build.sh makes symlinks
// named after each component) or, failing that, by the first argument
// (`hyperkube kubelet --config=...`). Each branch is the body of the upstream
// `k8s.io/kubernetes/cmd/<component>/<component>.go` main of the pinned release.
//
// This file is shared by every version's module (k8s/v1.*/main.go are symlinks to it).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	_ "time/tzdata" // for CronJob time zones (kube-apiserver, kube-controller-manager)

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

func run(name string) int {
	switch name {
	case "kube-apiserver":
		return cli.Run(apiserver.NewAPIServerCommand())
	case "kube-controller-manager":
		return cli.Run(controllermanager.NewControllerManagerCommand())
	case "kube-scheduler":
		return cli.Run(scheduler.NewSchedulerCommand())
	case "kubelet":
		return cli.Run(kubelet.NewKubeletCommand(context.Background()))
	case "kubectl":
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	}
	return -1
}

func main() {
	if code := run(filepath.Base(os.Args[0])); code >= 0 {
		os.Exit(code)
	}
	if len(os.Args) > 1 {
		// The commands read os.Args[1:]: drop the dispatch argument.
		name := os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
		if code := run(name); code >= 0 {
			os.Exit(code)
		}
	}
	fmt.Fprintf(os.Stderr, "usage: hyperkube {%s} [flags] (or run it through a symlink of that name)\n", strings.Join(components, "|"))
	os.Exit(2)
}
