#!/usr/bin/env bash
# GPU figures of the planning cycle and of rollout collection, on a CUDA machine, from the repository
# root: PyTorch CUDA eager vs CUDA graphs and (where the onnxruntime build has it) ONNX Runtime's CUDA
# provider, M = 32 and 128, beside the same machine's CPU (ONNX Runtime, 2 threads); the CUDA-graph
# parity test first. Runs without the colcon build or the venv (no ROS is imported), so a GPU box's own
# Python with torch, onnxruntime, numpy, scipy, opencv, safetensors, pyyaml, tqdm, rich and matplotlib
# will do. The benchmarks are `rad2 bench planner` and `rad2 bench rollouts`, run from the source tree
# as `python -m rad2_bringup.cli bench ...` (no install needed).
#   usage: bash tools/bench_gpu.sh [OUT_DIR=out/bench_gpu] [PYTHON=python3]
set -u
out=${1:-out/bench_gpu}
py=${2:-python3}
if [ "$out" = "-h" ] || [ "$out" = "--help" ]; then sed -n 2,9p "$0"; exit 0; fi
mkdir -p "$out"
export PYTHONPATH="$(printf "%s:" ros2_ws/src/*/)tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
"$py" -c "import torch, onnxruntime as o; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'onnxruntime', o.__version__, o.get_available_providers())" | tee -a "$out/gpu.txt"
"$py" -m pytest -q -p no:cacheprovider tests/integration/test_backends.py -k cuda_graph 2>&1 | tail -3
common=(--m 32 128 --cycles 200 --warmup 20)
"$py" -m rad2_bringup.cli bench planner --backend pytorch --device cuda --cuda-graphs off "${common[@]}" \
    --out "$out/torch_cuda_eager"
"$py" -m rad2_bringup.cli bench planner --backend pytorch --device cuda --cuda-graphs on "${common[@]}" \
    --out "$out/torch_cuda_graphs"
if "$py" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())"; then
    "$py" -m rad2_bringup.cli bench planner --backend onnxruntime "${common[@]}" \
        --ort-providers CUDAExecutionProvider CPUExecutionProvider --out "$out/ort_cuda"
else
    echo "onnxruntime here has no CUDAExecutionProvider (install onnxruntime-gpu): no ONNX Runtime CUDA row"
fi
"$py" -m rad2_bringup.cli bench planner --backend onnxruntime "${common[@]}" --out "$out/ort_cpu"
"$py" -m rad2_bringup.cli bench rollouts --clips 8 --workers 0 --backend pytorch --device cuda --out "$out/rollouts_cuda.md"
"$py" -m rad2_bringup.cli bench rollouts --clips 8 --workers 0 --out "$out/rollouts_cpu.md"
