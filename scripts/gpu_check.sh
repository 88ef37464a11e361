#!/usr/bin/env bash
# Kairos on a real NVIDIA GPU, in one short run (issue 6's device check):
#   1. the NVML backend probe (services/node_agent/devices/nvml.py): inventory, topology,
#      one telemetry sample with health, as JSON;
#   2. one real PyTorch task through the local-process runtime, granted the first GPU by
#      UUID (CUDA_VISIBLE_DEVICES): a matmul and a short training loop on the GPU, while
#      NVML's per-process memory (what the share watchdog judges) is sampled; its exit,
#      run seconds and checkpoint as the agent would report them.
# Runs with the GPU host's own Python: the probe needs only nvidia-ml-py and the standard
# library (Python >= 3.8); the runtime part needs Python >= 3.9 and torch built with CUDA.
# Nothing else from the project's dependencies.
#
#   PYTHON=python3 scripts/gpu_check.sh        # results also under $OUT (default: a temp dir)
#
# Exits non-zero when a part fails (no NVML or no GPU, torch missing or without CUDA, the
# task failing), saying which.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d -t kairos-gpu-check.XXXXXX)}
mkdir -p "$OUT"
status=0

echo "== $("$PY" -V 2>&1) at $(command -v "$PY"); results in $OUT"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L 2>&1 | tee "$OUT/nvidia-smi.txt"
else
  echo "(no nvidia-smi on PATH)"
fi

echo "== 1. NVML backend probe"
if "$PY" -m services.node_agent.devices.nvml >"$OUT/nvml_probe.json" 2>"$OUT/nvml_probe.err"; then
  cat "$OUT/nvml_probe.json"
  echo "NVML probe: OK"
else
  cat "$OUT/nvml_probe.err"
  echo "NVML probe: FAILED"
  status=1
fi

echo "== 2. a PyTorch task through the local-process runtime"
"$PY" - "$OUT" <<'PYEOF'
import asyncio
import json
import os
import sys
import tempfile

OUT = sys.argv[1]

TASK = r'''
import json, os, time
import torch
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), flush=True)
if not torch.cuda.is_available():
    raise SystemExit("torch sees no CUDA device (torch %s, built for CUDA %s)"
                     % (torch.__version__, torch.version.cuda))
dev = torch.device("cuda:0")
print("torch %s, CUDA %s, %d device(s) visible: %s" % (torch.__version__, torch.version.cuda,
      torch.cuda.device_count(), torch.cuda.get_device_name(0)), flush=True)
n = 8192
a = torch.randn(n, n, device=dev, dtype=torch.float16)
torch.cuda.synchronize()
t = time.time()
for _ in range(50):
    b = a @ a
torch.cuda.synchronize()
tflops = 50 * 2 * n ** 3 / (time.time() - t) / 1e12
torch.manual_seed(0)
w_true = torch.randn(256, 1, device=dev)
model = torch.nn.Linear(256, 1).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for step in range(300):
    x = torch.randn(1024, 256, device=dev)
    loss = torch.nn.functional.mse_loss(model(x), x @ w_true)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
time.sleep(3)  # hold the memory a moment: NVML samples the task's processes meanwhile
path = os.path.join(os.path.dirname(os.environ["KAIROS_CHECKPOINT_FILE"]), "model.pt")
torch.save(model.state_dict(), path)
with open(os.environ["KAIROS_CHECKPOINT_FILE"], "w") as f:
    f.write(path + "\n")
print(json.dumps({"fp16_matmul_tflops": round(tflops, 1), "loss_first": round(losses[0], 4),
                  "loss_last": round(losses[-1], 6),
                  "max_memory_allocated_mib": torch.cuda.max_memory_allocated() // 2**20}))
'''


def fail(why, result=None):
    print("task part: FAILED: " + why)
    with open(os.path.join(OUT, "task.json"), "w") as f:
        json.dump(dict(result or {}, ok=False, error=why), f, indent=2)
    sys.exit(1)


if sys.version_info < (3, 9):
    fail("the local-process runtime needs Python >= 3.9, this is %d.%d" % sys.version_info[:2])
try:
    import torch  # noqa: F401 - only to say clearly that it is missing
except ImportError:
    fail("torch is not installed for %s: pip install torch" % sys.executable)

from services.node_agent.devices.nvml import NvmlDevices, NvmlUnavailable
from services.node_agent.runtimes.base import GpuGrant, TaskLaunch
from services.node_agent.runtimes.local_process import LocalProcessRuntime


async def main():
    try:
        devices = NvmlDevices()
    except NvmlUnavailable as exc:
        fail("no NVML here: %s" % exc)
    gpus = devices.devices()
    if not gpus:
        fail("NVML lists no GPU")
    gpu = gpus[0]
    exits = asyncio.Queue()

    async def on_exit(ex):
        await exits.put(ex)

    state = tempfile.mkdtemp(prefix="kairos-gpu-task-")
    runtime = LocalProcessRuntime(on_exit, state, poll_s=0.2)
    launch = TaskLaunch(job_id="gpu-check", task_id="worker-0", attempt=1, image="",
                        command=(sys.executable, "-c", TASK),
                        env={"RANK": "0", **{k: os.environ[k] for k in ("PYTHONPATH",)
                                             if k in os.environ}},  # where torch may be
                        gpus=(GpuGrant(gpu.index, gpu.uuid),), cpu_milli=0, memory_mib=0)
    await runtime.start(launch)
    seen = {}  # NVML's per-process memory of the task's processes, as the watchdog sees it
    done = None
    while done is None:
        try:
            done = await asyncio.wait_for(exits.get(), 0.5)
        except asyncio.TimeoutError:
            pids = runtime.task_pids(launch.key)
            for s in await asyncio.to_thread(devices.sample):
                for pid, mib in s.process_memory_mib.items():
                    if pid in pids:
                        seen["gpu%d" % s.index] = max(seen.get("gpu%d" % s.index, 0), mib)
    health = [s.health_reasons() for s in devices.sample()]
    devices.close()
    log = runtime.logs(launch.key)
    await runtime.close()
    print(log, end="")
    result = {"gpu": {"index": gpu.index, "uuid": gpu.uuid, "model": gpu.model,
                      "memory_mib": gpu.memory_mib},
              "exit_code": done.exit_code, "reason": done.reason, "ran_s": done.ran_s,
              "checkpoint": done.checkpoint, "nvml_task_memory_mib": seen,
              "health_after": health,
              "cuda_visible_devices_ok": ("CUDA_VISIBLE_DEVICES=" + gpu.uuid) in log}
    last = [line for line in log.splitlines() if line.startswith("{")]
    if last:
        result["task"] = json.loads(last[-1])
    result["ok"] = done.exit_code == 0 and result["cuda_visible_devices_ok"] and bool(last)
    print(json.dumps(result, indent=2))
    if not seen:
        print("note: NVML showed no memory for the task's pids (a PID namespace, or no "
              "permission to list processes): the share watchdog could not judge it here")
    if not result["ok"]:
        fail("the task ended %s (exit %s)" % (done.reason, done.exit_code), result)
    with open(os.path.join(OUT, "task.json"), "w") as f:
        json.dump(result, f, indent=2)
    print("task part: OK")


asyncio.run(main())
PYEOF
[ $? -eq 0 ] || status=1

echo "== gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
