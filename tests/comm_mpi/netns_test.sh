#!/bin/bash
# The mpi plugin's tests across hosts: two network namespaces (hosts to Open
# MPI, each with its own hostname) on a bridge, each sending at most 1 Gbit/s
# (tbf; a 1 ms delay too where the kernel has netem), one daemon (MPI
# process) on each. mpirun runs in the first namespace and starts the other
# daemon through an rsh agent that enters the second. Every namespace and
# link it made is removed on any exit. Exit 77 (skipped) where namespaces
# cannot be made.
#   netns_test.sh TEST_BINARY MPIRUN
set -u
binary=$1
mpirun=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns_lib.sh
. "$here/netns_lib.sh"
trap zd_netns_cleanup EXIT
trap 'exit 130' INT TERM

zd_netns_setup 2 1gbit 1ms || { echo "netns_test: setting up the hosts failed" >&2; exit 1; }
echo "netns_test: hosts ${ZD_HOSTNAME[*]} at ${ZD_IP[*]} on $ZD_SUBNET, 1 Gbit/s per host (tbf); $ZD_DELAY_NOTE"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_plm_rsh_agent="$ZD_RSH_AGENT"
zd_netns_run 0 "$mpirun" --host "${ZD_IP[0]}:2,${ZD_IP[1]}:2" -np 2 --map-by node --oversubscribe --tag-output \
  --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$ZD_SUBNET" --mca oob_tcp_if_include "$ZD_SUBNET" \
  "$binary" --gtest_color=no --gtest_filter='*MpiOps*:*MpiCompressed*:AcrossNodes.*'
status=$?
echo "netns_test: mpirun exit status $status"
exit $status
