#!/usr/bin/env bash
# fio's 1 MiB sequential write of 1 GiB with an fsync at the end, through
# a separate `sluice mount` of a `sluice up` cluster (replicas 3), tmpfs.
# usage: fuse-fio.sh SLUICE_BIN RUNS
set -u
BIN=$1; RUNS=${2:-3}
D=/dev/shm/fl-fio; rm -rf $D; mkdir -p $D/data $D/mnt
$BIN up --data $D/data --listen 127.0.0.1:17780 --ready-file $D/ready --log-level warn > $D/up.log 2>&1 &
UP=$!
for i in $(seq 100); do [ -f $D/ready ] && break; sleep 0.2; done
CONF=$D/data/client.conf
$BIN --conf $CONF mount $D/mnt --log-level warn > $D/mount.log 2>&1 &
M=$!
for i in $(seq 100); do mountpoint -q $D/mnt && break; sleep 0.2; done
for r in $(seq $RUNS); do
  fio --name=w --filename=$D/mnt/f$r --rw=write --bs=1M --size=1G --end_fsync=1 --ioengine=psync --output-format=terse 2>&1 | awk -F';' '{printf "run '$r': fio write %.0f MB/s\n", $48*1024/1e6}'
  rm -f $D/mnt/f$r
done
fusermount3 -u $D/mnt; wait $M; kill $UP; wait $UP
rm -rf $D
