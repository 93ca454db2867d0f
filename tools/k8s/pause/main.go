// Command pause is the sandbox ("pause") container of the test node's pods: it holds the pod's
// namespaces and exits on SIGTERM or SIGINT. The upstream image is remote and cannot be pulled
// on the test machine, so tools/k8s/build.sh builds this static binary and an image FROM
// scratch around it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
