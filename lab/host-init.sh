#!/usr/bin/env bash
# A lab host's init, run by lab/hosts.py inside the host's own namespaces:
#   nsenter --net=/run/netns/lab-<node> unshare --mount --uts --propagation private host-init.sh boot DIR NODE ADDR MIRROR
# It gives the host its own files (bind mounts that only this mount namespace sees), starts its
# dockerd and becomes its sshd. `host-init.sh dockerd DIR MIRROR` starts dockerd again in a running
# host (entered with nsenter --net --mount --uts): the lab's "reboot" of the engine.
set -euo pipefail

start_dockerd() {
  local dir=$1 mirror=$2
  # As docker.service does (LimitNOFILE=infinity), as far as this machine allows (see lab/README.md).
  ulimit -Sn "$(ulimit -Hn)"
  # The shims directory first: dockerd finds nvidia-container-runtime-hook there (and so accepts
  # --gpus), and the runtime named nvidia. Docker's default bridge (docker0, NAT by its own iptables
  # rules, all inside this host's network namespace) as on a node: a build's RUN steps use it (the
  # default gateway image's apt reaches the lab's Debian mirror through it); every container the
  # program runs is on the host network or none.
  PATH=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin nohup dockerd \
    --data-root "$dir/docker" --exec-root /run/docker -H unix:///run/docker.sock --pidfile /run/docker.pid \
    --storage-driver overlay2 \
    --registry-mirror "http://$mirror" --insecure-registry "$mirror" --insecure-registry nvcr.io --insecure-registry ghcr.io \
    --add-runtime nvidia=/usr/local/sbin/nvidia-container-runtime --shutdown-timeout 10 \
    >>"$dir/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 100); do
    [ -S /run/docker.sock ] && return 0
    sleep 0.1
  done
  echo "dockerd did not create /run/docker.sock (see $dir/dockerd.log)" >&2
  return 1
}

case "$1" in
  boot)
    dir=$2 node=$3 addr=$4 mirror=$5
    mount --make-rprivate /
    hostname "$node"
    # The host's own view of the paths the program touches; the mount points exist (lab/hosts.py).
    mount --bind "$dir/etc-hosts" /etc/hosts
    mount --bind "$dir/data" /data
    mount --bind "$dir/var-lib-llm-cluster" /var/lib/llm-cluster
    mount --bind "$dir/etc-llm-cluster" /etc/llm-cluster
    mount --bind "$dir/home" /root
    mount --bind "$dir/run" /run
    mount --bind "$dir/shims" /usr/local/sbin
    # Shared again, but only within this namespace (its own peer groups): as on a systemd host, where
    # `/` is shared, so bind mounts with rslave propagation (node-exporter's /host) work.
    mount --make-rshared /
    mkdir -p /run/sshd /run/chrony
    # chrony disciplines nothing here (-x: the hosts share this machine's clock) but follows the lab's
    # NTP server on the registry host, so `chronyc tracking` answers as on a synchronised node.
    printf 'server %s iburst minpoll 0 maxpoll 4\npidfile /run/chrony/chronyd.pid\n' "$mirror" > "$dir/chrony.conf"
    chronyd -x -u root -f "$dir/chrony.conf" -l "$dir/chrony.log"
    start_dockerd "$dir" "$mirror"
    # Debian's sshd with its default config; only the listen address, host key and pid file differ.
    exec /usr/sbin/sshd -D -e -o "ListenAddress=$addr" -h "$dir/ssh_host_ed25519_key" \
      -o PidFile=/run/sshd.pid 2>>"$dir/sshd.log"
    ;;
  dockerd)
    start_dockerd "$2" "$3"
    ;;
  *)
    echo "usage: host-init.sh boot DIR NODE ADDR MIRROR | dockerd DIR MIRROR" >&2
    exit 2
    ;;
esac
