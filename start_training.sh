#!/usr/bin/env bash
# Builds, prints and runs the `accelerate launch` line for train.py: CPU, one GPU, many GPUs or many
# machines, with no interactive `accelerate config`. See usage() below.
set -euo pipefail
# A --time-budget counts from here: the preflight and the launcher are part of what the user waits for.
PICONEOX_LAUNCHED_AT=$(date +%s.%N)
export PICONEOX_LAUNCHED_AT

usage() {
  cat <<'EOF'
usage: ./start_training.sh --config NAME [--gpus N] [--procs N] [--resume X] [--max-steps N]
                           [--no-background-upload] [--mixed-precision no|fp16|bf16] [--data DIR_OR_SOURCE]
                           [--credentials KEY.json]
                           [--num-machines N --machine-rank R --main-process-ip IP [--main-process-port P]
                            [--rendezvous-timeout-seconds S]]
                           [--accelerate-config FILE] [--dry-run] [-- extra train.py flags]

Runs train.py under `accelerate launch` (--dry-run prints that command; start runs with this script,
which stops them cleanly: Ctrl-C on the bare command gives a traceback while the trainers still save).

  --config NAME            preset (train.py lists the valid ones)
  --gpus N                 GPUs per machine; 0 = CPU. Default: every GPU torch sees (CPU when none).
                           N > 0 with fewer GPUs visible to torch is an error (e.g. a CPU-only torch build)
  --procs N                CPU only: N processes talking over gloo (default 1)
  --resume X               auto or a checkpoint folder (passed to train.py)
  --max-steps N            passed to train.py
  --no-background-upload   passed to train.py
  --mixed-precision M      no, fp16 or bf16 (to train.py, and to accelerate on GPUs)
  --data D                 prepared dataset dir (or file:///dir), gs:// or s3://bucket/prefix, or demo (passed
                           to train.py). A bucket is synced once per machine before the launch, into
                           data/gcs-cache/<host>/[s3/]<bucket>/<prefix>, and train.py reads that folder
  --credentials F          service-account JSON key for gs:// (the data sync and train.py); s3:// reads
                           AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and AWS_ENDPOINT_URL
  --num-machines N         machines in the job (num_processes = gpus x machines)
  --machine-rank R         this machine's rank, 0..N-1 (needed with --num-machines > 1)
  --main-process-ip IP     address of rank 0 (needed with --num-machines > 1)
  --main-process-port P    port on rank 0 (default 29500 with --num-machines > 1, a free one otherwise)
  --rendezvous-timeout-seconds S
                           how long the machines wait for each other at the start (default 900, torch's); one
                           line says what a machine waits for, and Ctrl-C ends the wait at once
  --accelerate-config F    an accelerate config file (see configs/accelerate/): its distributed type
                           (DDP, FSDP) and options apply; process and machine counts, rank, address
                           and port always come from the flags above
  --dry-run                print the line and exit
  -h, --help               this text

Everything after `--` is appended to train.py's flags verbatim.
Ctrl-C / SIGTERM / SIGHUP (a closed terminal) are forwarded to every training process: each saves,
flushes its uploads and exits, and this script waits for them and exits 0 after a clean stop (a second
Ctrl-C stops at once). For a run that must outlive the terminal use tmux, nohup or systemd. If this
script is killed outright (SIGKILL), the training processes get SIGTERM at once and stop the same way;
none outlives it by more than --grace-seconds. One run per name: a second start of a run that is still
running (or still saving) exits 2 before the launch (lock: <output-dir>/.locks/<run>.lock).

With --num-machines > 1, GLOO_SOCKET_IFNAME is set (unless already set) to the interface that holds
--main-process-ip (machine 0) or routes to it (the others), never lo, so the checkpoint and stop-vote gloo
groups reach the other machines. A name that resolves to loopback here (machine 0's own hostname in
/etc/hosts, 127.0.1.1) is refused: pass the address the other machines use. --main-process-ip 127.0.0.1
runs every machine on this host (a test). On GPUs
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is set unless PYTORCH_CUDA_ALLOC_CONF is already set.

Inside a Slurm job step (configs/slurm/train.sbatch: one launcher per node) the allocation sets --num-machines,
--machine-rank, --main-process-ip (the first node's NodeAddr), a port derived from the job id, and --gpus
(SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE); Kubernetes torch jobs' MASTER_ADDR, MASTER_PORT, WORLD_SIZE or
PET_NNODES, and NODE_RANK / RANK do the same. A flag that contradicts them is an error (docs/clusters.md).

Test hooks: PICONEOX_FAKE_GPUS=N pretends N CUDA GPUs are visible (to check GPU lines on a CPU box);
PICONEOX_CPU_FSDP=1 shards for real over gloo when an FSDP --accelerate-config runs on CPU (--procs N, also 1).
EOF
}

die() { echo "error: $*" >&2; exit 2; }
# Until utils/run/supervise.py takes over (at the end), a stop signal ends this script (once the check in progress
# returns: bash runs traps only then; without a trap a SIGINT to this script alone was dropped).
trap 'echo "error: interrupted before the training processes started; nothing was trained" >&2; exit 130' INT TERM HUP

# A non-negative integer small enough for shell arithmetic, or die naming the flag.
need_int() {
  [[ "$2" =~ ^[0-9]{1,9}$ ]] || die "$1 '$2' is not a whole number from 0 to 999999999"
}

ROOT=$(dirname "$0")
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
"$PY" -c 'import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ("torch", "transformers", "accelerate"))))' \
  || die "no .venv in $ROOT and $PY lacks torch/transformers/accelerate: run ./setup.sh first"

gpus="" procs="" cpu_group="" machines="" rank="" ip="" port="" acc_config="" mp="" dry_run=0 rdzv=""
train_args=()
while [ $# -gt 0 ]; do
  opt=$1
  case "$opt" in
    -h|--help) usage; exit 0 ;;
    --dry-run) dry_run=1; shift; continue ;;
    --no-background-upload) train_args+=(--no-background-upload); shift; continue ;;
    --) shift; break ;;
    --config|--gpus|--procs|--resume|--max-steps|--mixed-precision|--data|--credentials|--num-machines|--machine-rank|\
    --main-process-ip|--main-process-port|--accelerate-config|--rendezvous-timeout-seconds)
      [ $# -ge 2 ] && [[ "$2" != --* ]] || die "$opt needs a value (see --help)" ;;
    *) die "unknown option '$opt' (see --help)" ;;
  esac
  val=$2
  case "$opt" in
    --config|--resume|--max-steps|--data|--credentials) train_args+=("$opt" "$val") ;;
    --mixed-precision)
      [[ "$val" =~ ^(no|fp16|bf16)$ ]] || die "--mixed-precision '$val' is not allowed (allowed: no, fp16, bf16)"
      mp=$val; train_args+=(--mixed-precision "$val") ;;
    --gpus) need_int "$opt" "$val"; gpus=$val ;;
    --procs) need_int "$opt" "$val"; [ "$val" -ge 1 ] || die "--procs '$val' must be >= 1"; procs=$val ;;
    --num-machines) need_int "$opt" "$val"; [ "$val" -ge 1 ] || die "--num-machines '$val' must be >= 1"; machines=$val ;;
    --machine-rank) need_int "$opt" "$val"; rank=$val ;;
    --main-process-port)
      need_int "$opt" "$val"; [ "$val" -ge 1 ] && [ "$val" -le 65535 ] || die "--main-process-port '$val' must be 1..65535"
      port=$val ;;
    --main-process-ip) ip=$val ;;
    --rendezvous-timeout-seconds)
      need_int "$opt" "$val"; [ "$val" -ge 1 ] && [ "$val" -le 604800 ] || die "$opt '$val' must be 1..604800 (a week)"
      rdzv=$val; train_args+=("$opt" "$val") ;;
    --accelerate-config) acc_config=$val ;;  # checked below, once --gpus is known
  esac
  shift 2
done
extra_args=("$@")
[[ " ${train_args[*]} " == *" --config "* ]] || die "missing --config NAME (see --help)"

# Inside a Slurm job step or a Kubernetes torch job the scheduler's allocation fills the machine flags (and --gpus
# on Slurm); a flag that contradicts it is one error line. Which variables mean "inside a job" is
# utils/run/allocation.py's to know: outside one it hands the flags back unchanged.
alloc=$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m utils.run.allocation "$machines" "$rank" "$ip" \
  "$port" "$gpus") || exit $?
# $(...) drops the trailing empty lines of flags left unset: a read past the end leaves its variable empty and
# fails, which set -e would turn into a silent exit 1
{ read -r machines; read -r rank; read -r ip; read -r port; read -r gpus; } <<< "$alloc" || true

# How many CUDA GPUs the run can use: what torch sees (CUDA_VISIBLE_DEVICES applies). nvidia-smi only
# explains a zero: GPUs present but a CPU-only torch build, or no driver at all.
visible_gpus() {
  if [ -n "${PICONEOX_FAKE_GPUS+x}" ]; then
    [[ "$PICONEOX_FAKE_GPUS" =~ ^[0-9]+$ ]] || die "PICONEOX_FAKE_GPUS '$PICONEOX_FAKE_GPUS' is not a whole number >= 0"
    echo "$PICONEOX_FAKE_GPUS"; return
  fi
  "$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0
}

# Why torch sees no GPU, for the error line.
no_gpu_reason() {
  local listed=0
  command -v nvidia-smi >/dev/null && listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "$listed" -gt 0 ]; then
    echo "nvidia-smi lists $listed GPU(s) but torch sees none: install the CUDA build of torch (README: GPU machines)"
  else
    echo "no CUDA GPU is visible (no nvidia-smi GPUs, torch.cuda.device_count() is 0)"
  fi
}

if [ "${gpus:-}" != 0 ]; then present=$(visible_gpus); else present=0; fi
[ -z "$gpus" ] && gpus=$present
if [ "$gpus" -gt 0 ] && [ "$present" -eq 0 ]; then
  die "--gpus $gpus asked but $(no_gpu_reason); use --gpus 0 to train on the CPU"
fi
[ "$gpus" -le "$present" ] || die "--gpus $gpus asked but only $present CUDA GPU(s) are visible"
[ "$gpus" -gt 0 ] && [ -n "$procs" ] && [ "$procs" -ne 1 ] \
  && die "--procs $procs is for CPU runs (--gpus 0); on GPUs there is one process per GPU"

# not YAML, empty, a DeepSpeed config, gpu_ids on a CPU run: one line here, not accelerate's traceback later
if [ -n "$acc_config" ]; then
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m utils.preflight accelerate-config "$acc_config" "$gpus" \
    || exit $?
fi

machines=${machines:-1}
if [ "$machines" -gt 1 ]; then
  [ -n "$ip" ] || die "--num-machines $machines needs --main-process-ip (the address of machine rank 0)"
  [ -n "$rank" ] || die "--num-machines $machines needs --machine-rank (0..$((machines - 1)))"
  [ "$rank" -lt "$machines" ] || die "--machine-rank $rank is out of range for --num-machines $machines (allowed 0..$((machines - 1)))"
  port=${port:-29500}
else
  [ -z "$rank$ip" ] || die "--machine-rank/--main-process-ip need --num-machines > 1"
fi

per_machine=$gpus
[ "$gpus" -eq 0 ] && per_machine=${procs:-1}
total=$((per_machine * machines))

# Always name a config file: without one, accelerate silently reads a leftover
# ~/.cache/huggingface/accelerate/default_config.yaml (e.g. gpu_ids '0' breaks any multi-process run).
# Models of 1B+ parameters on several GPUs default to FSDP2 (train.py --print-sharding, configs/plan.py: the
# resolved model's size, not the preset's name; docs/gpus.md "Several machines"); on several machines it runs as HSDP.
if [ -z "$acc_config" ] && [ "$gpus" -gt 0 ] && [ "$total" -gt 1 ]; then
  sharding=$("$PY" "$ROOT/train.py" "${train_args[@]}" "${extra_args[@]}" --print-sharding --gpus "$total") || exit $?
  if [ "$sharding" = fsdp ]; then acc_config="$ROOT/configs/accelerate/fsdp_production.yaml"; fi
fi
user_config=$acc_config
if [ -z "$acc_config" ] && [ "$total" -gt 1 ]; then
  acc_config="$ROOT/configs/accelerate/multi_gpu_ddp.yaml"
elif [ -z "$acc_config" ] && [ "$gpus" -gt 0 ]; then
  acc_config="$ROOT/configs/accelerate/single_gpu.yaml"
fi  # a single CPU process uses --cpu, which never reads the default file

envs=()
launch=(--num_processes "$total" --num_machines "$machines")
[ -n "$acc_config" ] && launch=(--config_file "$acc_config" "${launch[@]}")
if [ "$gpus" -eq 0 ]; then
  # CPU: OMP threads = cores / processes unless the user chose. `--cpu --num_processes N` would start ONE
  # process (STACK_NOTES.md); N gloo ranks need --multi_gpu plus ACCELERATE_USE_CPU=true.
  cores=$(nproc 2>/dev/null || echo 1)
  threads=${OMP_NUM_THREADS:-$(( cores / per_machine > 0 ? cores / per_machine : 1 ))}
  envs+=("OMP_NUM_THREADS=$threads")
  mp=${mp:-no}
  # PICONEOX_CPU_FSDP=1 with a config: even one process needs a (gloo) group for FSDP2, as one GPU does
  if [ "$total" -gt 1 ] || { [ -n "$user_config" ] && [ "${PICONEOX_CPU_FSDP:-}" = 1 ]; }; then
    cpu_group=1
    envs=(ACCELERATE_USE_CPU=true "${envs[@]}")
    [ -z "$user_config" ] && launch=(--multi_gpu "${launch[@]}")
  else
    launch+=(--cpu)
  fi
else
  # GPUs: expandable segments let the allocator grow blocks instead of fragmenting across the varying
  # shapes of compile, eval and save (fewer OOMs at the same peak). A setting of the user's wins.
  [ -z "${PYTORCH_CUDA_ALLOC_CONF:-}" ] && envs+=("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
  [ "$total" -gt 1 ] && [ -z "$user_config" ] && launch=(--multi_gpu "${launch[@]}")
fi
# On a signal torchrun SIGKILLs its workers after TORCH_ELASTIC_SHUTDOWN_TIMEOUT (30 s by default), which
# can cut train.py's save-and-exit (--grace-seconds) short on a large model: give it room.
[ "$total" -gt 1 ] && envs=("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-120}" "${envs[@]}")
[ -n "$mp" ] && launch+=(--mixed_precision "$mp")
# train.py compiles the model itself after prepare(); accelerate must not compile it a second time.
launch+=(--dynamo_backend no)
# One process: a failing run has already printed its own one-line error; no launcher traceback after it.
[ "$total" -eq 1 ] && launch+=(--quiet)
[ "$machines" -gt 1 ] && launch+=(--machine_rank "$rank" --main_process_ip "$ip")
[ -n "$rdzv" ] && launch+=(--rdzv_conf "timeout=$rdzv")
# Several machines: the gloo groups (checkpoint savers, stop vote) must bind to an interface the other machines
# reach, not to whatever the hostname resolves to (often 127.0.1.1): on machine 0 the one holding --main-process-ip,
# elsewhere the one routing to it, never lo. A name resolving to loopback here is refused (utils/run/network.py).
# A GLOO_SOCKET_IFNAME the user set wins.
if [ "$machines" -gt 1 ]; then  # checks the address; prints nothing when GLOO_SOCKET_IFNAME is set
  ifname=$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m utils.run.network "$ip") || exit $?
  [ -n "$ifname" ] && envs+=("GLOO_SOCKET_IFNAME=$ifname")
fi
# One machine: port 0 lets accelerate pick a free port, so two runs (or test suites) on one box never collide.
[ -z "$port" ] && [ "$machines" -eq 1 ] && { [ "$total" -gt 1 ] || [ -n "${cpu_group:-}" ]; } && port=0
[ -n "$port" ] && launch+=(--main_process_port "$port")

# utils/launch.py is `accelerate launch` (same flags) that exits with the run's own code (2 refused, 3 not uploaded)
# and prints a failed worker's one `error:` line instead of accelerate's exit 1 or torchrun's traceback.
cmd=("$PY" "$ROOT/utils/launch.py" "${launch[@]}" "$ROOT/train.py" "${train_args[@]}" "${extra_args[@]}")
if [ "$dry_run" -eq 1 ]; then
  # the line only runs if train.py takes its settings: a misspelt preset or a bad --set is its one line here too
  [ -n "${sharding:-}" ] || "$PY" "$ROOT/train.py" "${train_args[@]}" "${extra_args[@]}" --print-sharding \
    --gpus "$total" >/dev/null || exit $?
  line=$(printf '%q ' "${envs[@]}" "${cmd[@]}")
  echo "${line% }"
  exit 0
fi

# One run per name: the preflight takes the run's lock in this script's name (utils/run/runlock.py), the training
# processes join it, and it is removed once this script and all of them are gone (on every exit path).
# The scheduler's variables have been read (the flags above hold what they decided): the launcher sets its own for each
# training process, and a one-process launch would hand leftovers to train.py as a group to wait for.
unset MASTER_ADDR MASTER_PORT WORLD_SIZE RANK LOCAL_RANK NODE_RANK PET_MASTER_ADDR PET_MASTER_PORT PET_NNODES PET_NODE_RANK
export PICONEOX_RUN_LOCK_OWNER=$$
if [ "$machines" -gt 1 ]; then export PICONEOX_MACHINE_RANK=$rank; fi
# in TMPDIR, or where Python's tempfile falls back to when it is missing, read-only or full (then the run uses it too)
lock_note=$(PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m utils.preflight temp-note) || exit $?
[ -n "${TMPDIR:-}" ] && export TMPDIR="${lock_note%/*}"
trap 'rm -f "$lock_note"' EXIT  # until the supervisor, which removes it, takes over

# From here utils/run/supervise.py runs in this script's pid (bash dropped a stop signal that came while it waited for
# a check to return, and could miss one in `wait`). It runs the preflight: bad settings, a missing dataset or resume
# path, bad bucket settings are one line from train.py now, not a traceback from the launcher after the workers
# started; a bucket --data is synced there, once per machine and outside any process group (no rank waits on it), and
# the run reads the local folder the preflight prints. Then it starts the launcher in a process group of its own, so
# a terminal's Ctrl-C reaches only the supervisor, which forwards Ctrl-C/SIGTERM/SIGHUP to the training processes
# themselves (the launcher's children): each saves and exits 0, and the launcher then exits 0 too. Signalled itself,
# accelerate's launcher would die at once with a traceback (or torchrun would report the workers as failed) while
# train.py is still saving. utils/run/lifeline.py binds accelerate to the supervisor (SIGTERM when it dies, e.g. by
# SIGKILL), and each train.py to accelerate. The supervisor releases the run lock at the end; the run does not repeat
# the preflight's warnings (PICONEOX_PREFLIGHT_PASSED).
preflight=("$PY" "$ROOT/train.py" "${train_args[@]}" "${extra_args[@]}" --preflight --processes "$total")
exec "$PY" -S "$ROOT/utils/run/supervise.py" "$lock_note" "$total" "${#preflight[@]}" "${preflight[@]}" \
  env PICONEOX_PREFLIGHT_PASSED=1 "${envs[@]}" "${cmd[@]}"
