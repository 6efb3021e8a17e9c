// etcd, as the etcd repository's own main.go builds it: the server's etcdmain entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
