#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, built from Kubernetes' own components, with
# the fake GPU standing in for the NVIDIA driver; for gpuslice's cluster tests and for trying
# the DRA driver without a GPU or a cloud. Root only (it runs a kubelet and containerd).
#
#   scripts/cluster.sh build    build the components once, from the pinned Go modules in
#                               tests/cluster/build/ (etcd, kube-apiserver,
#                               kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
#                               kubectl, containerd, runc, CNI plugins, crictl, helm)
#   scripts/cluster.sh up       build if needed, make the images, start the cluster, wait for
#                               the node to be Ready; prints `export KUBECONFIG=...`
#   scripts/cluster.sh install  helm-install deploy/helm/gpuslice with the test values
#                               (tests/cluster/values-fake.yaml) and wait for the plugin
#   scripts/cluster.sh status   what runs, and the node as the API server sees it
#   scripts/cluster.sh down     stop everything and remove the cluster's state
#   scripts/cluster.sh env      print the exports (KUBECONFIG, PATH) for a shell
#   scripts/cluster.sh restart kubelet    stop and start the kubelet (a test's fault)
#   scripts/cluster.sh logs-on-failure WHAT   print pods, events and the components' last log
#                               lines when WHAT (the failures) is not empty; for CI's log
#
# Where things go (docs/cluster.md says more):
#   GPUSLICE_CLUSTER_CACHE  (default /var/cache/gpuslice-ci/cluster): Go module and build
#       caches, the binaries (bin-<recipe hash>/), the Debian root filesystem. Built once per
#       recipe: the first build takes ~25-40 min on 2 CPUs and ~2.5 GB; later runs reuse it.
#   GPUSLICE_CLUSTER_STATE  (default /var/lib/gpuslice-cluster): certificates, kubeconfigs,
#       etcd's data, logs (logs/<component>.log), pid files. Removed by `down`.
#   The node itself uses the standard paths: /var/lib/kubelet, /var/lib/containerd,
#   /run/containerd, /etc/cni/net.d, /etc/cdi, /var/run/cdi, /opt/gpuslice/lib, /dev/shm/gpuslice.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
recipes="$root/tests/cluster/build"
cache=${GPUSLICE_CLUSTER_CACHE:-/var/cache/gpuslice-ci/cluster}
state=${GPUSLICE_CLUSTER_STATE:-/var/lib/gpuslice-cluster}
node=${GPUSLICE_CLUSTER_NODE:-gpuslice-node}
# The node's address: an interface of its own with a private address, so that pods (in their own
# network namespaces) reach the API server at the address the kubernetes Service points to.
# 127.0.0.1 would be each pod's own loopback.
node_ip=${GPUSLICE_CLUSTER_NODE_IP:-10.217.0.1}
pod_cidr=10.218.0.0/16
service_cidr=10.219.0.0/16
api_service_ip=10.219.0.1
fake_gpus=${GPUSLICE_CLUSTER_GPUS:-2}
fake_memory=${GPUSLICE_CLUSTER_GPU_MEMORY:-16Gi}
images_dir="$state/images"
pki="$state/pki"
logs="$state/logs"
run="$state/run"

k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$recipes/kubernetes/go.mod")

die() { echo "cluster.sh: $*" >&2; exit 1; }
say() { echo "cluster.sh: $*" >&2; }

need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (it runs a kubelet, containerd and runc)"; }

# The binaries' directory is named by a hash of everything that decides them: the recipes
# (go.mod, go.sum, the wrappers), this script's build step and the Go version.
recipe_hash() {
    {
        go version
        (cd "$recipes" && find . -type f | LC_ALL=C sort | xargs sha256sum)
        sed -n '/^build_components()/,/^}/p' "${BASH_SOURCE[0]}"
    } | sha256sum | cut -c1-16
}

bin_dir() { echo "$cache/bin-$(recipe_hash)"; }

build_components() {
    local out=$1 tmp=$1.tmp
    command -v go >/dev/null || die "go is not on PATH: the cluster's components are built from Go modules"
    rm -rf "$tmp"
    mkdir -p "$tmp" "$cache/go"
    export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOTOOLCHAIN=local GOFLAGS=-mod=readonly
    local flags=(-trimpath -ldflags=-s\ -w)
    local start=$SECONDS
    # Kubernetes from its module: k8s.io/kubernetes v1.37.x with each staging module pinned by
    # replace to its published v0.37.x (tests/cluster/build/kubernetes/go.mod says why).
    say "building kubernetes $k8s_version (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl)"
    # The version every component reports (and Helm's kubeVersion checks), stamped as
    # Kubernetes' own build does (hack/lib/version.sh); a module build leaves "v0.0.0-master".
    local kv=${k8s_version#v} stamp="" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        stamp+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=${kv%%.*}"
        stamp+=" -X $pkg.gitMinor=$(echo "$kv" | cut -d. -f2) -X $pkg.gitTreeState=clean"
    done
    (cd "$recipes/kubernetes" && go build -trimpath -ldflags="-s -w$stamp" -o "$tmp/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
        k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl)
    say "building etcd"
    (cd "$recipes/etcd" && go build "${flags[@]}" -o "$tmp/etcd" ./cmd/etcd)
    # containerd without the snapshotters that need C headers this machine lacks (btrfs) or a
    # kernel feature it does not use (devmapper, zfs); overlayfs is the one the node uses.
    say "building containerd, runc, CNI plugins, crictl"
    (cd "$recipes/containerd" && go build "${flags[@]}" -tags 'no_btrfs no_devmapper no_zfs' -o "$tmp/" \
        github.com/containerd/containerd/v2/cmd/containerd \
        github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
        github.com/containerd/containerd/v2/cmd/ctr \
        sigs.k8s.io/cri-tools/cmd/crictl)
    # runc with seccomp (libseccomp, cgo): containerd gives every pod sandbox the runtime's
    # default profile, and a runc without seccomp refuses it ("seccomp not supported").
    (cd "$recipes/containerd" && CGO_ENABLED=1 go build "${flags[@]}" -tags seccomp -o "$tmp/runc" github.com/opencontainers/runc)
    mkdir -p "$tmp/cni"
    (cd "$recipes/containerd" && go build "${flags[@]}" -o "$tmp/cni/" \
        github.com/containernetworking/plugins/plugins/main/bridge \
        github.com/containernetworking/plugins/plugins/main/loopback \
        github.com/containernetworking/plugins/plugins/ipam/host-local)
    say "building helm"
    (cd "$recipes/helm" && go build "${flags[@]}" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
    echo "$k8s_version" >"$tmp/VERSION"
    mv "$tmp" "$out"
    # Binaries of older recipes are of no use (~750 MB each).
    find "$cache" -maxdepth 1 -name 'bin-*' ! -path "$out" -exec rm -rf {} +
    say "built in $((SECONDS - start)) s into $out"
}

cmd_build() {
    local bin
    bin=$(bin_dir)
    if [ -x "$bin/kubelet" ] && [ -f "$bin/VERSION" ]; then
        say "components of kubernetes $k8s_version are built: $bin"
        return
    fi
    build_components "$bin"
}

# --- images -----------------------------------------------------------------------------

rootfs_tar() {
    local tar="$cache/rootfs-bookworm-minbase.tar"
    if [ ! -s "$tar" ]; then
        command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
        say "making the image's Debian root filesystem (mmdebstrap --variant=minbase bookworm)"
        mmdebstrap --quiet --variant=minbase --mode=root --format=tar bookworm "$tar.tmp"
        mv "$tar.tmp" "$tar"
    fi
    echo "$tar"
}

# The pause image (the pod sandbox) and gpuslice's image, imported into containerd's k8s.io
# namespace. gpuslice's image is deploy/Dockerfile's final stage, assembled without a
# daemon: Debian bookworm minbase (for debian:bookworm-slim) and the release binaries at the
# paths the Dockerfile copies them to (tests/cluster/test_image.py holds the two together).
cmd_images() {
    local bin rel
    bin=$(bin_dir)
    mkdir -p "$images_dir"
    rel=${CARGO_TARGET_DIR:-$root/target}/release
    say "building gpuslice's release binaries"
    (cd "$root" && cargo build --release -q -p gpuslice -p gpuslice-shim -p gpuslice-dra -p gpuslice-burn)
    gcc -static -O2 -o "$images_dir/pause" "$root/tests/cluster/image/pause.c"
    python3 "$root/tests/cluster/image/oci_image.py" --name localhost/gpuslice-cluster/pause:1 \
        --out "$images_dir/pause.tar" --file "$images_dir/pause:/pause" --entrypoint /pause >&2
    python3 "$root/tests/cluster/image/oci_image.py" --name localhost/gpuslice:dev \
        --out "$images_dir/gpuslice.tar" --layer "$(rootfs_tar)" \
        --file "$rel/gpuslice:/usr/bin/gpuslice" \
        --file "$rel/gpuslice-dra:/usr/bin/gpuslice-dra" \
        --file "$rel/gpuslice-burn:/usr/bin/gpuslice-burn" \
        --file "$rel/libgpuslice.so:/usr/lib/gpuslice/libgpuslice.so" \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --entrypoint gpuslice-dra >&2
    for img in pause gpuslice; do
        "$bin/ctr" -a /run/containerd/containerd.sock -n k8s.io images import \
            --platform linux/amd64 "$images_dir/$img.tar" >/dev/null
    done
    say "images imported: localhost/gpuslice-cluster/pause:1, localhost/gpuslice:dev"
}

# --- certificates -----------------------------------------------------------------------

# cert NAME CN O [SANS]: a key and a certificate signed by the cluster's CA.
cert() {
    local name=$1 cn=$2 o=$3 sans=${4:-}
    local subj="/CN=$cn"
    [ -n "$o" ] && subj="/O=$o$subj"
    openssl genrsa -out "$pki/$name.key" 2048 2>/dev/null
    openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=serverAuth,clientAuth"
        [ -n "$sans" ] && echo "subjectAltName=$sans"
    } >"$pki/$name.ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
    rm -f "$pki/$name.csr" "$pki/$name.ext"
}

kubeconfig() { # NAME CERT
    local name=$1 c=$2
    cat >"$state/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpuslice
  cluster:
    certificate-authority: $pki/ca.crt
    server: https://$node_ip:6443
users:
- name: $name
  user:
    client-certificate: $pki/$c.crt
    client-key: $pki/$c.key
contexts:
- name: $name
  context: {cluster: gpuslice, user: $name}
current-context: $name
EOF
}

make_pki() {
    mkdir -p "$pki"
    chmod 700 "$pki"
    openssl genrsa -out "$pki/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=gpuslice-cluster-ca" -days 30 \
        -out "$pki/ca.crt" 2>/dev/null
    cert apiserver kube-apiserver "" \
        "IP:$node_ip,IP:127.0.0.1,IP:$api_service_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert admin kubernetes-admin system:masters
    cert controller-manager system:kube-controller-manager ""
    cert scheduler system:kube-scheduler ""
    cert kube-proxy system:kube-proxy ""
    cert kubelet "system:node:$node" system:nodes "IP:$node_ip,IP:127.0.0.1,DNS:$node"
    # The API server's client certificate for the kubelet (logs, exec): bound to the
    # kubelet-api-admin role below rather than made a cluster admin.
    cert apiserver-kubelet-client kube-apiserver-kubelet-client ""
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    kubeconfig admin admin
    kubeconfig controller-manager controller-manager
    kubeconfig scheduler scheduler
    kubeconfig kube-proxy kube-proxy
    kubeconfig kubelet kubelet
}

# --- processes --------------------------------------------------------------------------

start() { # NAME CMD...: in the background, in its own session, logged, with a pid file
    local name=$1
    shift
    setsid "$@" >>"$logs/$name.log" 2>&1 </dev/null &
    echo $! >"$run/$name.pid"
}

alive() { local p; p=$(cat "$run/$1.pid" 2>/dev/null) && kill -0 "$p" 2>/dev/null; }

wait_for() { # SECONDS WHAT CMD...
    local limit=$1 what=$2
    shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            say "$what: not ready after $limit s; the last lines of the logs:"
            tail -n 20 "$logs"/*.log >&2 || true
            return 1
        fi
        sleep 1
    done
}

# One node, one of each: no leader election (a lease renewal that times out on a loaded host
# would make the scheduler or the controller manager exit, and nothing here restarts them).
#
# Feature gates, set explicitly so the cluster is the same whatever a release's defaults:
# DRAConsumableCapacity: shareable devices with consumable capacity (memory, compute): the
#   driver's whole placement model; beta and on by default since 1.36, named anyway.
# DRAResourceClaimDeviceStatus: the driver may write device status; on by default (beta).
# ResourceHealthStatus: the kubelet opens the plugin's health stream and reports device
#   health in pod status (kubelet only).
# DRADeviceTaints: a device may be tainted (a GPU gone: NoSchedule for new claims).
gates_common="DRAConsumableCapacity=true,DRADeviceTaints=true"
gates_kubelet="$gates_common,ResourceHealthStatus=true"

cmd_up() {
    need_root up
    cmd_build
    local bin
    bin=$(bin_dir)
    export PATH="$bin:$PATH"
    if alive kube-apiserver 2>/dev/null; then
        say "the cluster is already up (scripts/cluster.sh down first to start afresh)"
        print_env
        return
    fi
    mkdir -p "$state" "$logs" "$run" "$images_dir"
    [ -f "$pki/ca.crt" ] || make_pki

    # The node's address (see node_ip above).
    if ! ip link show gpuslice0 >/dev/null 2>&1; then
        # A bridge with no ports: this kernel has no dummy interfaces; either is only an address.
        ip link add gpuslice0 type bridge
        ip addr add "$node_ip/32" dev gpuslice0
        ip link set gpuslice0 up
    fi
    sysctl -qw net.ipv4.ip_forward=1
    # kube-proxy's rules apply to bridged pod traffic only with this on (the kubelet warns
    # otherwise); the bridge module is built in on this kernel.
    sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true

    # etcd
    start etcd "$bin/etcd" --name "$node" --data-dir "$state/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster "$node=http://127.0.0.1:2380" --log-level warn
    wait_for 60 etcd curl -sf http://127.0.0.1:2379/health

    # containerd, with CDI on (the default in 2.x; named so the config says it)
    mkdir -p /etc/containerd /etc/cni/net.d /etc/cdi /var/run/cdi
    sed -e "s#@BIN@#$bin#g" "$root/tests/cluster/config/containerd.toml" >"$state/containerd.toml"
    sed -e "s#@POD_CIDR@#$pod_cidr#g" "$root/tests/cluster/config/cni.conflist" \
        >/etc/cni/net.d/10-gpuslice-cluster.conflist
    start containerd env PATH="$bin:$PATH" "$bin/containerd" --config "$state/containerd.toml"
    wait_for 60 containerd "$bin/ctr" -a /run/containerd/containerd.sock version
    cmd_images

    # the fake GPU as the node's driver (tests/cluster/fake-driver.sh says how it stands in)
    bash "$root/tests/cluster/fake-driver.sh" install "$fake_gpus" "$fake_memory" >&2

    # control plane
    start kube-apiserver "$bin/kube-apiserver" \
        --advertise-address "$node_ip" --bind-address 0.0.0.0 --secure-port 6443 \
        --etcd-servers http://127.0.0.1:2379 \
        --client-ca-file "$pki/ca.crt" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority "$pki/ca.crt" \
        --kubelet-preferred-address-types InternalIP \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
        --service-cluster-ip-range "$service_cidr" \
        --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --allow-privileged=true --feature-gates "$gates_common"
    wait_for 120 kube-apiserver "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" get --raw /readyz
    # The API server's kubelet client may read logs and exec (the role kubeadm binds too).
    "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" create clusterrolebinding \
        kube-apiserver-kubelet-client --clusterrole system:kubelet-api-admin \
        --user kube-apiserver-kubelet-client >/dev/null
    start kube-controller-manager "$bin/kube-controller-manager" \
        --kubeconfig "$state/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$state/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$state/controller-manager.kubeconfig" \
        --use-service-account-credentials \
        --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
        --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
        --allocate-node-cidrs --cluster-cidr "$pod_cidr" --service-cluster-ip-range "$service_cidr" \
        --leader-elect=false --feature-gates "$gates_common"
    start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$state/scheduler.kubeconfig" \
        --authentication-kubeconfig "$state/scheduler.kubeconfig" \
        --authorization-kubeconfig "$state/scheduler.kubeconfig" \
        --leader-elect=false --feature-gates "$gates_common"

    # the node
    sed -e "s#@PKI@#$pki#g" -e "s#@GATES@#$(gates_yaml "$gates_kubelet")#" \
        -e "s#@NODE_IP@#$node_ip#g" \
        "$root/tests/cluster/config/kubelet.yaml" >"$state/kubelet.yaml"
    start_kubelet "$bin"
    start kube-proxy "$bin/kube-proxy" --kubeconfig "$state/kube-proxy.kubeconfig" \
        --proxy-mode nftables --hostname-override "$node" --cluster-cidr "$pod_cidr" \
        --feature-gates "$gates_common"
    wait_for 180 "node $node Ready" "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" \
        wait --for=condition=Ready "node/$node" --timeout=5s
    say "up: kubernetes $k8s_version, node $node ($node_ip), $fake_gpus fake GPU(s) of $fake_memory"
    print_env
}

start_kubelet() { # BIN
    start kubelet "$1/kubelet" --config "$state/kubelet.yaml" \
        --kubeconfig "$state/kubelet.kubeconfig" --hostname-override "$node" --node-ip "$node_ip" \
        --node-labels gpuslice.dev/enabled=true
}

# restart kubelet: what an operator's `systemctl restart kubelet` does (the tests' fault).
cmd_restart() {
    need_root restart
    local c=${1:-} p bin
    bin=$(bin_dir)
    [ "$c" = kubelet ] || die "restart: only the kubelet can be restarted (got '${c}')"
    p=$(cat "$run/$c.pid" 2>/dev/null) || die "restart: $c is not running"
    kill "$p" 2>/dev/null || true
    local end=$((SECONDS + 30))
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.5; done
    kill -9 "$p" 2>/dev/null || true
    start_kubelet "$bin"
    say "kubelet restarted (pid $(cat "$run/$c.pid"))"
}

gates_yaml() { # "A=true,B=true" -> "{A: true, B: true}"
    echo "{$1}" | sed -e 's/=/: /g' -e 's/,/, /g'
}

print_env() {
    echo "export KUBECONFIG=$state/admin.kubeconfig PATH=$(bin_dir):\$PATH"
}

cmd_install() {
    need_root install
    local bin
    bin=$(bin_dir)
    export KUBECONFIG="$state/admin.kubeconfig" PATH="$bin:$PATH"
    # The fake driver's configuration, as the node's CDI spec gives it to pods.
    cat >"$state/values-driver.yaml" <<EOF
driver:
  env:
    - {name: FAKEGPU_STATE_DIR, value: /run/fakegpu}
    - {name: FAKEGPU_DEVICES, value: "$fake_gpus"}
    - {name: FAKEGPU_MEMORY, value: "$fake_memory"}
EOF
    helm upgrade --install gpuslice "$root/deploy/helm/gpuslice" --namespace gpuslice-system \
        --create-namespace -f "$root/tests/cluster/values-fake.yaml" -f "$state/values-driver.yaml" \
        --wait --timeout 5m
    kubectl -n gpuslice-system rollout status ds/gpuslice --timeout=180s
}

cmd_status() {
    local bin c
    bin=$(bin_dir)
    for c in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
        if alive $c; then echo "$c: running (pid $(cat "$run/$c.pid"))"; else echo "$c: not running"; fi
    done
    if alive kube-apiserver; then
        "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" get nodes -o wide || true
    fi
}

# After a failed test run (the failures named in $1; nothing when empty): what a reader of CI's
# log needs to see why, before `down` removes the state. Pods, events, gpuslice's own logs and the
# tail of each component's log.
cmd_logs_on_failure() {
    [ -n "${1:-}" ] || return 0
    local bin kc c
    bin=$(bin_dir)
    kc=("$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" --request-timeout=20s)
    echo "=== cluster state after: $1"
    if alive kube-apiserver; then
        "${kc[@]}" get nodes,pods,resourceclaims -A -o wide 2>&1 || true
        "${kc[@]}" get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 40 || true
        "${kc[@]}" -n gpuslice-system logs ds/gpuslice --all-containers --tail=80 2>&1 || true
    fi
    for c in kubelet kube-scheduler kube-apiserver containerd; do
        [ -f "$logs/$c.log" ] || continue
        echo "=== last lines of $logs/$c.log"
        tail -n 30 "$logs/$c.log"
    done
}

cmd_down() {
    need_root down
    local bin c p
    bin=$(bin_dir)
    # The kubelet first (it would restart what is stopped), then every pod sandbox through
    # the runtime, so their mounts and network namespaces go with them.
    for c in kubelet kube-proxy; do
        p=$(cat "$run/$c.pid" 2>/dev/null) && kill "$p" 2>/dev/null || true
    done
    if [ -S /run/containerd/containerd.sock ] && [ -x "$bin/crictl" ]; then
        local crictl=("$bin/crictl" -r unix:///run/containerd/containerd.sock -t 20s)
        "${crictl[@]}" stopp $("${crictl[@]}" pods -q 2>/dev/null) >/dev/null 2>&1 || true
        "${crictl[@]}" rmp -f $("${crictl[@]}" pods -q 2>/dev/null) >/dev/null 2>&1 || true
    fi
    for c in kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
        p=$(cat "$run/$c.pid" 2>/dev/null) && kill "$p" 2>/dev/null || true
    done
    # Give them their clean stop, then make sure.
    sleep 2
    for c in kubelet kube-proxy kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
        p=$(cat "$run/$c.pid" 2>/dev/null) && kill -9 "$p" 2>/dev/null || true
    done
    pkill -9 -f 'containerd-shim-runc-v2' 2>/dev/null || true
    # What the pods and the runtime left mounted.
    local m
    for m in $(awk '$2 ~ "^(/var/lib/kubelet|/run/containerd|/var/lib/containerd|/run/netns)" {print $2}' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    nft delete table ip kube-proxy 2>/dev/null || true
    nft delete table ip6 kube-proxy 2>/dev/null || true
    ip link del cni0 2>/dev/null || true
    ip link del gpuslice0 2>/dev/null || true
    bash "$root/tests/cluster/fake-driver.sh" remove >&2 || true
    rm -rf /var/lib/kubelet /var/lib/containerd /run/containerd /var/lib/cni \
        /etc/cni/net.d/10-gpuslice-cluster.conflist /var/run/cdi/gpuslice.dev-* \
        /dev/shm/gpuslice /opt/gpuslice/lib "$state"
    say "down: the cluster's processes stopped and its state removed ($state)"
}

case "${1:-}" in
build) cmd_build ;;
up) cmd_up ;;
install) cmd_install ;;
status) cmd_status ;;
down) cmd_down ;;
env) print_env ;;
logs-on-failure) cmd_logs_on_failure "${2:-}" ;;
restart) cmd_restart "${2:-}" ;;
images) need_root images; cmd_images ;;
*)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    [ -z "${1:-}" ] || exit 2
    ;;
esac
