#!/bin/bash
# The real NVML path, on a machine with an NVIDIA GPU and its driver: `domaind gpus`
# (text, JSON, a missing library) beside nvidia-smi's answers, and `domaind run` on real
# NVML for 12 s (IMEX simulated, no kubelet, no cluster). Usage:
#   tests/gpu/nvml-check.sh PATH/TO/domaind OUTDIR
# Prints what it runs; OUTDIR keeps check.log, gpus.json, nvidia-smi-q.txt and run.log.
# Read the result against docs/ARCHITECTURE.md, "GPU inventory" (what a GPU without an
# NVLink fabric and one in a GB200/GB300 clique answer).
set -u
D=$(realpath "$1")
OUT=$(realpath "$2")
mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1
set -x
nvidia-smi -L
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version --format=csv
nvidia-smi -q > "$OUT/nvidia-smi-q.txt"; grep -n -A8 "Fabric" "$OUT/nvidia-smi-q.txt" | head -30
grep -i nvidia /proc/devices
ldconfig -p | grep -i nvidia-ml
$D gpus; echo "gpus rc=$?"
$D gpus --output json > "$OUT/gpus.json"; echo "gpus json rc=$?"; cat "$OUT/gpus.json"
$D gpus --nvml-library /nonexistent/libnvidia-ml.so.1; echo "missing rc=$?"
R=$(mktemp -d); mkdir -p $R/local
$D certs init --out $R/ca && $D certs issue --ca $R/ca --node gpu-node --out $R/tls
timeout -s INT 12 $D run --node-name gpu-node --pod-ip 127.0.0.1 --backend local --local-dir $R/local \
  --state-dir $R/state --cdi-dir $R/cdi --kubelet-plugins-dir $R/plugins --kubelet-registry-dir $R/reg \
  --tls-dir $R/tls --imex-sim-builtin --channel-nodes skip --http-addr 127.0.0.1:0 --state-addr 127.0.0.1:19466 \
  > "$OUT/run.log" 2>&1 &
RUN=$!
python3 - <<'PY'
import json, time, urllib.request
deadline = time.time() + 10
while True:
    try:
        view = json.load(urllib.request.urlopen("http://127.0.0.1:19466/state", timeout=2))
        print("state:", json.dumps({k: view.get(k) for k in ("node", "domains", "gossip")}, indent=1))
        break
    except Exception as error:
        if time.time() > deadline:
            print("state error:", error)
            break
        time.sleep(0.2)
PY
wait $RUN
echo "run rc=$?"
grep -v "^\s*$" "$OUT/run.log" | head -40
