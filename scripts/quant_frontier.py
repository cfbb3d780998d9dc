"""
Width + quantization against quantization alone, where users serve a model: llama.cpp (issue #72), on
SmolLM2-135M-Instruct.

    pip install llama-cpp-python             (builds llama.cpp from source, a few minutes)
    python scripts/quant_frontier.py [--part=loss|speed|all]        (scripts/quant_frontier.sh)

Models, each exported once (``convert.py --to_gguf --gguf_type=f32 --pad_width=32``) and quantized by llama.cpp's
own quantizer (``llama_model_quantize``) to every type of ``TYPES``:
- ``original``: the imported model — itself a dequantized Q4_1 file, so every point re-quantizes that same base;
- the protocol's recipes (scripts/protocol.py: chosen on dev before this script, calibrated and trained on train,
  seed 0): ``free25`` (tied PCA, −25% parameters, training-free), ``distill25`` (the same + distillation: the
  recovery), ``free50`` (−50%, training-free). At m = 432 a row is not a multiple of llama.cpp's 32-blocks, so the
  export zero-pads it to 448 (grow.pad_residual: the same function, the tied head kept, +3.7% of the residual's
  weights); m = 288 and 576 are multiples of 32, and none of the three of 256, so the K-quants fall back on the rows
  that read the residual (lgpt/formats/llama_cpp.py says how) — the original's as much as ours;
- ``+hadamard``: rotated at its width by a randomized Hadamard matrix before the export (``transform.py
  --kind=hadamard``, seed 0; the same function, QuaRot's rotation, the paper's same-width application). The rotation
  folds the final norm's gain into the head, so the head is untied: its extra bytes are in the point.
The grid: the original at every type of ``TYPES`` (the quantization-only frontier), then ``POINTS``.
Loss: llama.cpp's own logits (llama-cpp-python, its default F16 KV cache, one thread) over the first DEV_WINDOWS
windows of tinyshakespeare's dev split and its whole test split, in the protocol's 256-token windows
(BatchLoader.full_split): dev for every choice (the pick for a byte budget), test read once per point (recorded in
the dataset's test_reads.json). The
F32 exports of the original and of ``free25`` are checked against our own import on the first dev windows.
Speed (``--part=speed``, on an otherwise idle machine): each point in a fresh process, llama.cpp on THREADS threads —
a 256-token prompt read from an empty cache and 64 tokens generated one at a time, the median of 3 after a warm-up
— and the process's peak resident memory; our own PyTorch model (float32, ``model.generate_tokens``'s KV cache)
timed the same way beside it. Speeds are compared only as ratios within one run.
Writes results/quant_frontier/results.json after every point.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from protocol import summary  # noqa: E402

import harness  # noqa: E402
from harness import RESULTS, cached  # noqa: E402
from lgpt.formats import llama_cpp as lcpp  # noqa: E402
from lgpt.plumbing.checkpoint import load_model  # noqa: E402
from lgpt.plumbing.dataset import BatchLoader, reads_of_test  # noqa: E402
from lgpt.plumbing.logger import progress  # noqa: E402
from real_model import BLOCK, imported, parameters, prepared, run_step  # noqa: E402
from real_quantization import save  # noqa: E402

TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")  # llama.cpp's usual ladder: the frontier
# the points beside it, most telling first (each costs ~5 single-core minutes: the whole test split through llama.cpp
# at ~150 tokens/s on one core): the two examples (−25% + Q4_K_M against Q3_K_M, −50% + Q4_K_M against Q2_K),
# each model at 8 and 3 bits, the rotation where it can pay (4 and 2 bits)
POINTS = (("distill25", "none", "Q4_K_M"), ("free50", "none", "Q4_K_M"), ("free25", "none", "Q4_K_M"),
          ("original", "hadamard", "Q4_K_M"), ("original", "hadamard", "Q2_K"), ("distill25", "none", "Q8_0"),
          ("free50", "none", "Q8_0"), ("distill25", "none", "Q3_K_M"), ("free50", "none", "Q2_K"),
          ("distill25", "hadamard", "Q4_K_M"), ("distill25", "none", "Q2_K"))
RECIPES = ("original", "distill25", "free50", "free25")
DEV_WINDOWS = 32  # the first 32 dev windows (8,192 tokens) for the one choice made here; test is read whole
THREADS = 2  # the speed part: llama.cpp's threads (the machine's cores)
PROMPT, GENERATE, REPEATS = 256, 64, 3
CHECK_WINDOWS = 4  # dev windows on which llama.cpp's F32 logits are compared with our import's
EXPERIMENT = "quant_frontier"
# what happened to the test reads beside the plan, in order (said, not hidden)
READ_NOTES = ["frontier-original-F16 read test twice: the first run stopped after its read, before its result was "
              "kept (its folder was not made); the second read gave the recorded loss"]
RESULTS_FILE = os.path.join(RESULTS, EXPERIMENT, "results.json")


def model_dir(recipe: str, src: str, data: dict[str, str]) -> str:
    """The recipe's model: the import, or the protocol's cached seed-0 run (built there if it is missing)."""
    if recipe == "original":
        return src
    import protocol
    built = protocol.distilled(src, data, recipe, 0) if recipe in protocol.DISTILLED else \
        protocol.transformed(src, data, recipe, 0)
    return built["out_dir"]


def rotated(source: str, recipe: str) -> str:
    """``source`` rotated at its own width by a randomized Hadamard matrix (exact; the head untied)."""
    width = load_model(source)[0].config.n_embd
    args = ["transform.py", f"--in_dir={source}", "--kind=hadamard", f"--width={width}", "--seed=0",
            "--eval_iters=0", "--threads=1"]
    spec = {"args": [a if not a.startswith("--in_dir") else "--in_dir=" + harness.relative(source) for a in args]}

    def build(out: str) -> dict:
        return {"step": run_step([*args, f"--out_dir={out}", "--overwrite=True"])}

    return cached(EXPERIMENT, f"{recipe}-hadamard", spec, build)[0]


def exported(source: str, label: str) -> tuple[str, dict]:
    """``source`` as an F32 GGUF, zero-padded to a multiple of 32 (convert.py, as a user runs it)."""
    spec = {"model": harness.relative(source), "pad": lcpp.ROW_BLOCK, "v": 1}

    def build(out: str) -> dict:
        os.makedirs(out, exist_ok=True)
        step = run_step(["convert.py", f"--in_dir={source}", f"--to_gguf={os.path.join(out, 'model-F32.gguf')}",
                         "--gguf_type=f32", f"--pad_width={lcpp.ROW_BLOCK}", "--overwrite=True"])
        return {"step": step, "parameters": parameters(source)}

    out, result = cached(EXPERIMENT, f"{label}-f32", spec, build)
    return os.path.join(out, "model-F32.gguf"), result


def quantized(f32: str, label: str, kind: str) -> tuple[str, dict]:
    """llama.cpp's quantizer on the F32 export (one thread), and what the file holds."""
    spec = {"source": harness.relative(f32), "type": kind, "llama_cpp": lcpp.llama_cpp().__version__}

    def build(out: str) -> dict:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"model-{kind}.gguf")
        return {"quantize": lcpp.quantize(f32, path, kind, threads=1), "file": lcpp.tensor_mix(path)}

    out, result = cached(EXPERIMENT, f"{label}-{kind}", spec, build)
    return os.path.join(out, f"model-{kind}.gguf"), result


def windows(data_dir: str, split: str, recipe: str = "") -> list[tuple[np.ndarray, np.ndarray]]:
    """The protocol's consecutive 256-token windows of ``split`` (BatchLoader.full_split's, one at a time; a test
    read is recorded for ``recipe``)."""
    loader = BatchLoader(data_dir, BLOCK, 1, "cpu", test_for=recipe if split == "test" else "")
    return [(x[0].numpy(), y[0].numpy()) for x, y in loader.full_split(split)]


def evaluated(path: str, label: str, data_dir: str) -> dict:
    """llama.cpp's loss of the GGUF file on the first DEV_WINDOWS dev windows and (once, recorded) the whole test
    split."""
    spec = {"file": harness.relative(path), "block": BLOCK, "data": harness.relative(data_dir),
            "dev_windows": DEV_WINDOWS, "v": 1}

    def build(out: str) -> dict:
        os.makedirs(out, exist_ok=True)
        llm = lcpp.load(path, BLOCK, threads=1, logits_all=True)
        result = {}
        for split, key in (("val", "dev"), ("test", "test")):
            started = time.time()
            split_windows = windows(data_dir, split, f"frontier-{label}")
            split_windows = split_windows[:DEV_WINDOWS] if key == "dev" else split_windows
            result[key] = summary(lcpp.window_losses(llm, progress(split_windows, f"llama.cpp {label} {key}",
                                                                   len(split_windows), unit="window")),
                                  time.time() - started)
            print(f"  {label} {key}: {result[key]['loss']:.4f} ({result[key]['seconds']:.0f} s)", flush=True)
        llm.close()
        return result

    return cached(EXPERIMENT, f"{label}-eval", spec, build)[1]


def checked(path: str, source: str, data_dir: str) -> dict:
    """llama.cpp (F32 file, F32 KV cache) against our import of the same model on the first dev windows."""
    model = load_model(source)[0].eval()
    llm = lcpp.load(path, BLOCK, threads=1, logits_all=True, f32_cache=True)
    worst, agree = 0.0, []
    for x, _ in windows(data_dir, "val")[:CHECK_WINDOWS]:
        with torch.no_grad():
            ours = model(torch.from_numpy(x.astype(np.int64)[None]), all_logits=True)[0][0]
            ours = ours.double().log_softmax(-1).numpy()
        llm.reset()
        llm.eval([int(t) for t in x])
        theirs = lcpp.log_softmax(np.asarray(llm.scores[:len(x)]))
        worst = max(worst, float(np.abs(ours - theirs).max()))
        agree.append(float((ours.argmax(-1) == theirs.argmax(-1)).mean()))
    llm.close()
    return {"windows": CHECK_WINDOWS, "max_abs_dlogp": worst, "same_argmax": float(np.mean(agree))}


def grid() -> list[tuple[str, str, str]]:
    """Every (recipe, rotation, type), in the order they are built: the frontier, then POINTS."""
    return [("original", "none", t) for t in TYPES] + list(POINTS)


def point(src: str, data: dict[str, str], recipe: str, rotation: str, kind: str) -> dict:
    """One point: built, quantized and evaluated (each step cached)."""
    source = model_dir(recipe, src, data)
    label = recipe + ("+hadamard" if rotation == "hadamard" else "")
    model = rotated(source, recipe) if rotation == "hadamard" else source
    f32, export = exported(model, label)
    path, made = quantized(f32, label, kind)
    losses = evaluated(path, f"{label}-{kind}", data["shakespeare"])
    print(f"[{label} {kind}] {made['file']['bytes'] / 1e6:.1f} MB, test {losses['test']['loss']:.4f}", flush=True)
    return {"recipe": recipe, "rotation": rotation, "type": kind, "path": path, "parameters": export["parameters"],
            "width": load_model(model)[0].config.n_embd, **made["file"],
            "quantize_seconds": made["quantize"]["seconds"], "losses": losses}


# ------------------------------------------------------------------------------------------------ speed

def speed_of(path: str, threads: int) -> dict:
    """One point's llama.cpp speed (run in a process of its own: the peak memory is the process's)."""
    llm = lcpp.load(path, PROMPT + GENERATE, threads)
    prompt = [int(t) for t in np.arange(PROMPT) % 1000 + 1000]  # fixed ids: the same work for every model
    return dict(lcpp.speed(llm, prompt, GENERATE, REPEATS), threads=threads)


def torch_speed_of(model_dir_: str, threads: int) -> dict:
    """Our own PyTorch model (float32) timed as llama.cpp is: the prompt, then GENERATE tokens with the KV cache."""
    torch.set_num_threads(threads)
    model = load_model(model_dir_)[0].eval()
    # a model finetuned at 256 tokens keeps that context; a prompt that fills it would make each new token re-read
    # the whole window (generate_tokens slides without a cache), so the prompt leaves room for the generation
    length = min(PROMPT, model.config.block_size - GENERATE)
    prompt = (torch.arange(length) % 1000 + 1000).unsqueeze(0)

    def once() -> tuple[float, float]:
        started = time.perf_counter()
        with torch.no_grad():
            model(prompt)
        read = time.perf_counter() - started
        started = time.perf_counter()
        for _ in model.generate_tokens(prompt, GENERATE, temperature=1e-6, top_k=1):
            pass
        return read, time.perf_counter() - started - read  # generate_tokens reads the prompt again first

    once()
    reads, gens = zip(*(once() for _ in range(REPEATS)))
    return {"prompt_tokens": length, "prompt_tokens_per_s": round(length / float(np.median(reads)), 1),
            "generate_tokens_per_s": round(GENERATE / float(np.median(gens)), 1), "threads": threads,
            "peak_rss_mb": lcpp.peak_rss_mb()}


def in_process(flag: str, target: str) -> dict:
    """Run this script with ``flag=target`` in a fresh process and read the JSON line it prints."""
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    done = subprocess.run([sys.executable, os.path.abspath(__file__), f"{flag}={target}"], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"timing {target} failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def key(p: dict) -> str:
    return f"{p['recipe']}|{p['rotation']}|{p['type']}"


def speeds(built: list[dict], sources: dict[str, str]) -> dict:
    """Every point's llama.cpp speed and our own float32 model's, in one run (ratios only)."""
    started = time.time()
    out = {"llama_cpp": {}, "torch": {}}
    for i, p in enumerate(built):
        out["llama_cpp"][key(p)] = in_process("--speed_of", p["path"])
        left = (time.time() - started) / (i + 1) * (len(built) - i - 1)
        print(f"  speed {i + 1}/{len(built)} {key(p)}: {out['llama_cpp'][key(p)]['generate_tokens_per_s']} tok/s "
              f"(ETA {left:.0f} s)", flush=True)
    for recipe, path in sources.items():
        out["torch"][recipe] = in_process("--torch_speed_of", path)
    out["seconds"] = round(time.time() - started, 1)
    return out


# ------------------------------------------------------------------------------------------------ main

def saved() -> dict:
    if not os.path.exists(RESULTS_FILE):
        return {}
    with open(RESULTS_FILE, encoding="utf-8") as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("loss", "speed", "all"), default="all")
    parser.add_argument("--points_first", action="store_true", help="build POINTS before the original's ladder (a "
                        "second process on the other core; both share the cache; only the first writes the results)")
    parser.add_argument("--points_reversed", action="store_true", help="build POINTS from the last (a third "
                        "process, once the ladder is built: the two then meet in the middle)")
    parser.add_argument("--built_only", action="store_true", help="build nothing: write the results of the points "
                        "already built (the others listed in not_built)")
    parser.add_argument("--speed_of", default="", help=argparse.SUPPRESS)  # one point's timing, in its own process
    parser.add_argument("--torch_speed_of", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.speed_of or args.torch_speed_of:
        print(json.dumps(speed_of(args.speed_of, THREADS) if args.speed_of else
                         torch_speed_of(args.torch_speed_of, THREADS)))
        return
    started = time.time()
    torch.set_num_threads(1)
    lcpp.llama_cpp()  # one line naming the install, before any work
    if args.built_only:
        harness.TRACE = {}  # cached() returns what is built and raises NotCached for the rest
    src, _ = imported()
    data = {"shakespeare": prepared(src, "shakespeare")}
    sources = {r: model_dir(r, src, data) for r in RECIPES}
    payload = saved()
    jobs = grid()
    if args.points_first:
        jobs = jobs[len(TYPES):] + jobs[:len(TYPES)]
    if args.points_reversed:
        jobs = jobs[len(TYPES):][::-1]
    built, missing = [], []
    for job in progress(jobs, "frontier points", len(jobs), unit="point"):
        try:
            built.append(point(src, data, *job))
        except harness.NotCached:
            missing.append(list(job))
    payload["not_built"] = missing
    if args.points_first or args.points_reversed:
        return
    if args.part in ("loss", "all"):
        check = {r: checked(exported(sources[r], r)[0], sources[r], data["shakespeare"])
                 for r in ("original", "free25")}
        timed = {key(p): p["speed"] for p in payload.get("points", []) if p.get("speed")}  # an earlier speed part's
        payload.update(points=[dict({k: v for k, v in p.items() if k != "path"}, mb=round(p["bytes"] / 1e6, 1),
                                    **({"speed": timed[key(p)]} if key(p) in timed else {})) for p in built],
                       check=check)
    if args.part in ("speed", "all"):
        timed = speeds(built, sources)
        for p in payload["points"]:
            p["speed"] = timed["llama_cpp"].get(key(p))
        payload["speed"] = {"torch": timed["torch"], "threads": THREADS, "seconds": timed["seconds"]}
    payload.update(model="SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)", block=BLOCK,
                   text="tinyshakespeare", llama_cpp_python=lcpp.llama_cpp().__version__, types=list(TYPES),
                   test_reads=len(reads_of_test(data["shakespeare"])), read_notes=READ_NOTES)
    save(payload, started, EXPERIMENT, "scripts/quant_frontier.sh")


if __name__ == "__main__":
    main()
