#!/usr/bin/env bash
# Used by failure_test (Elastic.UnderMpirunTheStandaloneStoreOutlivesRankZeroAndAHandStartedRankJoins):
# railshard-store hosts the job's store outside the ranks; mpirun --enable-recovery (OpenMPI
# keeps the other processes when one dies) starts 4 ranks of collective_check; rank 0 kills
# itself at iteration 20; once the survivors have shrunk, a fifth process started by hand
# (RAILSHARD_JOIN=1, as another shell or host would) joins and the survivors admit it.
# Prints every process's stdout, then their stderr on stderr, then the exit statuses.
#   mpirun_external_store.sh STORE_BIN MPIRUN COLLECTIVE_CHECK DIR
# Needs RAILSHARD_TOKEN in the environment.
set -u
store=$1 mpirun=$2 check=$3 dir=$4
rm -f "$dir/addr"
"$store" --host 127.0.0.1 --port 0 --address-file "$dir/addr" >/dev/null 2>"$dir/store.err" &
store_pid=$!
for _ in $(seq 200); do [ -s "$dir/addr" ] && break; sleep 0.05; done
RAILSHARD_STORE_ADDR=$(head -n 1 "$dir/addr")
export RAILSHARD_STORE_ADDR RAILSHARD_STORE_EXTERNAL=1
common=(--iterations 150 --count 1000 --elastic 1 --grow 1 --pace-ms 20)
"$mpirun" --allow-run-as-root --oversubscribe --bind-to none --enable-recovery -np 4 \
  -x RAILSHARD_STORE_ADDR -x RAILSHARD_STORE_EXTERNAL -x RAILSHARD_TOKEN -x RAILSHARD_TIMEOUT \
  "$check" "${common[@]}" --die-rank 0 --die-after 20 --die-how kill \
  >"$dir/mpi.out" 2>"$dir/mpi.err" &
mpi_pid=$!
# Bounded: 20 s for the survivors to shrink.
for _ in $(seq 400); do grep -q "in generation 1 (shrink" "$dir/mpi.err" && break; sleep 0.05; done
RAILSHARD_JOIN=1 RAILSHARD_RANK=0 RAILSHARD_WORLD_SIZE=4 "$check" "${common[@]}" \
  >"$dir/join.out" 2>"$dir/join.err"
join_rc=$?
wait "$mpi_pid"
mpi_rc=$?
kill "$store_pid"
wait "$store_pid"
store_rc=$?
cat "$dir/mpi.out" "$dir/join.out"
cat "$dir/mpi.err" "$dir/join.err" "$dir/store.err" >&2
echo "mpirun exit $mpi_rc, joiner exit $join_rc, store exit $store_rc"
