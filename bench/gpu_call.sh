#!/usr/bin/env bash
# Issue 31's GPU measurements as two device calls (each may carry 64 MiB: the repository, plus the backbone in A
# or the PyAV wheel in B). Run from the repository root on the GPU machine; results go to $OUT.
#   bash bench/gpu_call.sh A   # carries .gpu (bench/gpu_prepare.py) and .whl (pyzmq): correctness, backbone,
#                              # mode switch, warm-up, the op alone
#   bash bench/gpu_call.sh B   # carries .whl and .whl-av (PyAV): decode, streams per GPU, policies
#   bash bench/gpu_call.sh C   # carries .gpu and .whl: A's parts again, then policies at 448 px (GPU-bound)
#   bash bench/gpu_call.sh F   # carries .whl: the fused LoRA linear (bench/gpu.py's fused part), then the backbone
#                              # with its best tiles beside the other modes
#   bash bench/gpu_call.sh D   # carries .gpu and .whl: correctness (the float32 engine too), backbone and ops
#                              # with the default tiles, `vlora-va tune` (this GPU's table), backbone and ops
#                              # with it, then policies at 224 px with their shed reasons
# Each part runs under its own time cap and writes its JSON as it goes.
set -u
call=${1:?A or B}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
t_start=$(date +%s)

# The package is not installed there: the two folders that install under vlora_va (pyproject.toml) join it by
# links, and the repository root goes on the path (the daemon and ingest start as `python3 -m vlora_va.cli`).
[ -e vlora_va/kernels ] || ln -s ../kernels vlora_va/kernels
[ -e vlora_va/ingest ] || ln -s ../streams vlora_va/ingest
wheels=(.whl/*.whl)
[ "$call" = B ] && wheels+=(.whl-av/*.whl)
policies=(--backbone vit-l --skews 0.9,0.5 --premerge 0,8192 --senders 4 --duration 8)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
  || echo "wheel install FAILED"
export PYTHONPATH=/tmp/site:$PWD
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, triton, transformers, zmq; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'triton', triton.__version__, 'transformers', transformers.__version__, 'pyzmq', zmq.__version__)"
  python3 -c "import av; print('av', av.__version__, av.codec.hwaccel.hwdevices_available())" 2>&1
  ls /usr/local/nvidia/lib64 2>/dev/null | grep -i -E "nvcuvid|libcuda" ; ldconfig -p | grep -i -E "nvcuvid|libcuda.so"
  nproc; free -g | head -2
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

part() {  # part CAP_S COMMAND...: one part under its time cap
  local cap=$1; shift
  local t0=$(date +%s)
  timeout -k 10 "$cap" "$@"
  echo "== $* : rc $? in $(( $(date +%s) - t0 )) s (cap $cap s; call at $(( $(date +%s) - t_start )) s)"
}

if [ "$call" = D ]; then
  # OUT keeps only log.txt and one archive (a call returns at most 8 files), refreshed after every part
  res=/tmp/gpu-res; mkdir -p "$res/tuned"; mv "$OUT/env.txt" "$res/"
  export VLORA_VA_TABLES=$res/tables
  pack() { tar -cf "$OUT/results.tar" -C "$res" .; }
  part 70 python3 bench/gpu.py --parts correctness --out "$res" ${GPU_ARGS:-}; pack
  part 40 python3 bench/gpu.py --parts backbone,ops --out "$res" ${GPU_ARGS:-}; pack
  # the first tune compiles every candidate tile (Triton's disk cache serves the later ones); each writes as it ends
  part 130 python3 -m vlora_va.cli tune --layouts images --images 16,64 --adapters 4 --ranks 16; pack
  part 30 python3 -m vlora_va.cli tune --layouts images --images 8,32 --adapters 4 --ranks 16; pack
  part 45 python3 -m vlora_va.cli tune --layouts runs --images 8,32 --adapters 4,8 --ranks "16;8,16,32,64" \
    --mixes uniform,shuffled; pack
  part 45 python3 -m vlora_va.cli tune --layouts runs --hidden 768 --mlp 3072 --images 8,32 --adapters 4,8 \
    --ranks "16;8,16,32,64" --mixes uniform,shuffled; pack
  part 40 python3 bench/gpu.py --parts backbone,ops --out "$res/tuned" ${GPU_ARGS:-}; pack
  part 125 python3 bench/gpu_policies.py --device cuda --out "$res" --budget-s 110 --backbone vit-l --skews 0.9 \
    --premerge 0 --policies vlora,unmerge-only --senders 4 --duration 6; pack
elif [ "$call" = F ]; then  # the fused LoRA linear per layer shape and tile, then the backbone with the best tiles
  part 110 python3 bench/gpu.py --parts fused,backbone --out "$OUT" ${GPU_ARGS:-}
elif [ "$call" = E ]; then  # D's correctness again (the float32 engine), one policy point with the loop's shares
  res=/tmp/gpu-res; mkdir -p "$res"; mv "$OUT/env.txt" "$res/"
  pack() { tar -cf "$OUT/results.tar" -C "$res" .; }
  part 70 python3 bench/gpu.py --parts correctness --out "$res" ${GPU_ARGS:-}; pack
  part 90 python3 bench/gpu_policies.py --device cuda --out "$res" --budget-s 80 --backbone vit-l --skews 0.9 \
    --premerge 0 --policies ${POLICIES:-vlora} --senders 4 --duration 6 ${POLICY_ARGS:-}; pack
elif [ "$call" = C ]; then
  part 60 python3 bench/gpu.py --parts correctness --out "$OUT" ${GPU_ARGS:-}
  part 40 python3 bench/gpu.py --parts backbone --out "$OUT" ${GPU_ARGS:-}
  part 30 python3 bench/gpu.py --parts switch --out "$OUT" ${GPU_ARGS:-}
  part 45 python3 bench/gpu.py --parts warmup --out "$OUT" ${GPU_ARGS:-}
  part 165 python3 bench/gpu_policies.py --device cuda --out "$OUT" --budget-s 150 --backbone vit-l-448 --skews 0.9 \
    --premerge 0 --senders 2 --duration 8
  part 40 python3 bench/gpu.py --parts ops --out "$OUT" ${GPU_ARGS:-}
elif [ "$call" = A ]; then
  part 100 python3 bench/gpu.py --parts correctness --out "$OUT" ${GPU_ARGS:-}
  part 60 python3 bench/gpu.py --parts backbone --out "$OUT" ${GPU_ARGS:-}
  part 30 python3 bench/gpu.py --parts switch --out "$OUT" ${GPU_ARGS:-}
  part 120 python3 bench/gpu.py --parts warmup --out "$OUT" ${GPU_ARGS:-}
  part 50 python3 bench/gpu.py --parts ops --out "$OUT" ${GPU_ARGS:-}
else
  part 40 python3 bench/gpu.py --parts decode --out "$OUT" ${GPU_ARGS:-}
  # The real backbone where call A left it on this machine, else random weights of its shape (speed only).
  bb=/tmp/vlora-gpu/backbone
  if [ ! -e "$bb/model.safetensors" ]; then
    bb=/tmp/vlora-gpu/random-dinov2-small
    python3 -c "
import torch, transformers as T
torch.manual_seed(0)
cfg = T.Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                     patch_size=14, image_size=518, layerscale_value=1.0)
T.Dinov2Model(cfg).save_pretrained('$bb', safe_serialization=True)"
  fi
  echo "streams backbone: $bb"
  part 210 python3 bench/gpu_streams.py --backbone "$bb" --device cuda --out "$OUT" --budget 190 ${STREAMS_ARGS:---duration 10 --settle 5}
  part 170 python3 bench/gpu_policies.py --device cuda --out "$OUT" --budget-s 150 "${policies[@]}"
fi
echo "call $call done in $(( $(date +%s) - t_start )) s"
