#!/usr/bin/env bash
# Cold sequential NFSv3 copy in and out with libnfs's nfs-cp (one request
# at a time), 512 MiB, data on /dev/shm, side by side in each run:
# `sluice nfs` over `sluice up` (replicas 1) and NFS-Ganesha's VFS FSAL
# exporting a tmpfs directory. Needs root, libnfs-utils, nfs-ganesha,
# nfs-ganesha-vfs and a running rpcbind (Ganesha registers with it).
# NFS_FLAGS adds global flags to `sluice nfs` (e.g. --cpuprofile FILE).
# Beside them, Ganesha again through a relay that copies every byte
# through user space both ways (one more process and TCP connection per
# byte, as the gateway-to-node hop is, with no checksum and no storage
# work): the cost of a hop on this machine. Each figure is followed by
# [wall s, CPU s of nfs-cp, of sluice up, of sluice nfs, of ganesha].
# Needs go (to build the relay).
# usage: nfs-ganesha.sh SLUICE_BIN RUNS
#   -> MB/s per run: sluice write/read | ganesha write/read | relay write/read
set -u
BIN=$1; RUNS=${2:-3}
D=/dev/shm/fl-bench; rm -rf $D; mkdir -p $D/data $D/gexp
SZ=512
head -c $((SZ<<20)) /dev/urandom > $D/src
$BIN up --data $D/data --listen 127.0.0.1:17790 --ready-file $D/ready --log-level warn > $D/up.log 2>&1 &
UP=$!
for i in $(seq 100); do [ -f $D/ready ] && break; sleep 0.2; done
CONF=$D/data/client.conf
$BIN --conf $CONF mkdir /b; $BIN --conf $CONF policy set /b --replicas 1 >/dev/null
$BIN --conf $CONF ${NFS_FLAGS:-} nfs --listen 127.0.0.1:17791 --export '/ 127.0.0.1(rw,no_root_squash)' --ready-file $D/nready --log-level warn > $D/nfs.log 2>&1 &
NFS=$!
for i in $(seq 100); do [ -f $D/nready ] && break; sleep 0.2; done
cat > $D/ganesha.conf <<G
NFS_CORE_PARAM { NFS_Port = 17792; MNT_Port = 17793; NLM_Port = 17794; Rquota_Port = 17795; Protocols = 3; Enable_RQUOTA = false; Enable_NLM = false; }
NFSV4 { Graceless = true; }
EXPORT { Export_Id = 77; Path = $D/gexp; Pseudo = /gexp; Access_Type = RW; Squash = No_Root_Squash; Protocols = 3; Transports = TCP; SecType = sys; FSAL { Name = VFS; } }
LOG { Default_Log_Level = WARN; }
G
ganesha.nfsd -F -f $D/ganesha.conf -L $D/ganesha.log -p $D/ganesha.pid &
GAN=$!
sleep 5
cat > $D/relay.go <<'R'
package main

import (
	"net"
	"os"
)

func pump(dst, src net.Conn) {
	buf := make([]byte, 1<<20) // through user space: no splice
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.(*net.TCPConn).CloseWrite()
}

func main() {
	ln, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		panic(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			u, err := net.Dial("tcp", os.Args[2])
			if err != nil {
				c.Close()
				return
			}
			go pump(u, c)
			pump(c, u)
		}()
	}
}
R
(cd $D && GO111MODULE=off go build -o relay relay.go) || { kill $GAN $NFS $UP; exit 1; }
$D/relay 127.0.0.1:17796 127.0.0.1:17792 &
REL=$!
RURL="nfs://127.0.0.1$D/gexp/%s?version=3&nfsport=17796&mountport=17793&uid=0&gid=0"
SURL="nfs://127.0.0.1/b/%s?version=3&nfsport=17791&mountport=17791&uid=0&gid=0"
GURL="nfs://127.0.0.1$D/gexp/%s?version=3&nfsport=17792&mountport=17793&uid=0&gid=0"
pc() { awk '{print $14+$15}' /proc/$1/stat; }
t() {
  local a=$(pc $UP) b=$(pc $NFS) g=$(pc $GAN) s=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o $D/tm "$@" >/dev/null 2>$D/err || { echo FAIL "$@"; cat $D/err; }
  local e=$(date +%s.%N); read cu cs < $D/tm
  echo "$SZ / ($e - $s)" | bc -l | xargs printf "%.0f"
  printf " [%.2f %.2f %.2f %.2f %.2f]" $(echo "$e - $s" | bc) $(echo "$cu + $cs" | bc) \
    $(echo "($(pc $UP) - $a) / 100" | bc -l) $(echo "($(pc $NFS) - $b) / 100" | bc -l) $(echo "($(pc $GAN) - $g) / 100" | bc -l)
}
for r in $(seq $RUNS); do
  sw=$(t nfs-cp $D/src "$(printf "$SURL" f$r)")
  rm -f $D/out; sr=$(t nfs-cp "$(printf "$SURL" f$r)" $D/out); cmp -s $D/src $D/out || echo sluice-read-MISMATCH
  gw=$(t nfs-cp $D/src "$(printf "$GURL" f$r)")
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  rm -f $D/out; gr=$(t nfs-cp "$(printf "$GURL" f$r)" $D/out); cmp -s $D/src $D/out || echo ganesha-read-MISMATCH
  rw=$(t nfs-cp $D/src "$(printf "$RURL" r$r)")
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  rm -f $D/out; rr=$(t nfs-cp "$(printf "$RURL" r$r)" $D/out); cmp -s $D/src $D/out || echo relay-read-MISMATCH
  rm -f $D/gexp/r$r
  echo "run $r: sluice write $sw read $sr | ganesha write $gw read $gr | relay write $rw read $rr"
  rm -f $D/gexp/f$r
done
kill $REL $GAN $NFS; wait $NFS; kill $UP; wait $UP 2>/dev/null; wait $GAN 2>/dev/null
rm -rf $D
