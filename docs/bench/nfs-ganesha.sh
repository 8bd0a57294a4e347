#!/usr/bin/env bash
# Cold sequential NFSv3 copy in and out with libnfs's nfs-cp (one request
# at a time), 512 MiB, data on /dev/shm, side by side in each run:
# `sluice nfs` over `sluice up` (replicas 1) and NFS-Ganesha's VFS FSAL
# exporting a tmpfs directory. Needs root, libnfs-utils, nfs-ganesha,
# nfs-ganesha-vfs and a running rpcbind (Ganesha registers with it).
# NFS_FLAGS adds global flags to `sluice nfs` (e.g. --cpuprofile FILE).
# usage: nfs-ganesha.sh SLUICE_BIN RUNS  -> MB/s per run: sluice write/read | ganesha write/read
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
SURL="nfs://127.0.0.1/b/%s?version=3&nfsport=17791&mountport=17791&uid=0&gid=0"
GURL="nfs://127.0.0.1$D/gexp/%s?version=3&nfsport=17792&mountport=17793&uid=0&gid=0"
t() { local s=$(date +%s.%N); "$@" >/dev/null 2>$D/err || { echo FAIL "$@"; cat $D/err; }; local e=$(date +%s.%N); echo "$SZ / ($e - $s)" | bc -l | xargs printf "%.0f"; }
for r in $(seq $RUNS); do
  sw=$(t nfs-cp $D/src "$(printf "$SURL" f$r)")
  rm -f $D/out; sr=$(t nfs-cp "$(printf "$SURL" f$r)" $D/out); cmp -s $D/src $D/out || echo sluice-read-MISMATCH
  gw=$(t nfs-cp $D/src "$(printf "$GURL" f$r)")
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  rm -f $D/out; gr=$(t nfs-cp "$(printf "$GURL" f$r)" $D/out); cmp -s $D/src $D/out || echo ganesha-read-MISMATCH
  echo "run $r: sluice write $sw read $sr | ganesha write $gw read $gr"
  rm -f $D/gexp/f$r
done
kill $GAN $NFS; wait $NFS; kill $UP; wait $UP 2>/dev/null; wait $GAN 2>/dev/null
rm -rf $D
