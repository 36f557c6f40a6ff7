# Sourced by the distributed benches: launch_torch N SCRIPT ARGS... starts
# N PyTorch ranks of SCRIPT on this machine with the env:// contract (what
# torchrun would set), waits for them all and exits with the first failure.
# Its own launcher, because Debian's torchrun (PyTorch 1.13 on Python
# 3.11) fails before it starts a Python script. $PYTHON, or python3.
launch_torch() {
  _n=$1; shift
  # as torchrun (and dplua's launcher): the cores shared out among the ranks
  if [ -z "${OMP_NUM_THREADS:-}" ] && [ "$_n" -gt 1 ]; then
    _t=$(( $(nproc) / _n )); [ "$_t" -ge 1 ] || _t=1
    export OMP_NUM_THREADS=$_t
  fi
  _port=$(${PYTHON:-python3} -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  _pids=""
  _r=0
  while [ "$_r" -lt "$_n" ]; do
    RANK=$_r LOCAL_RANK=$_r WORLD_SIZE=$_n LOCAL_WORLD_SIZE=$_n MASTER_ADDR=127.0.0.1 MASTER_PORT=$_port \
      ${PYTHON:-python3} "$@" &
    _pids="$_pids $!"
    _r=$((_r + 1))
  done
  _status=0
  for _p in $_pids; do wait "$_p" || _status=$?; done
  return $_status
}
