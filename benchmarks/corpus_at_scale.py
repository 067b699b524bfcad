"""Corpus preparation at Indo4B scale in bounded memory: prepare_corpus -> build_vocab (on a
sample) -> create_examples, each through its command line, on corpora built by repeating
../shared/data/id_corpus_sample with a document-level prefix per copy (so deduplication keeps
every copy), at several sizes; peak resident memory of each stage's whole process tree (the
tool and its workers, sampled every 0.1 s), wall time and words/s.

    python -m benchmarks.corpus_at_scale --workdir=/tmp/corpus_scale --sizes_gb=0.3,3
    python -m benchmarks.corpus_at_scale --workdir=/tmp/cs --sizes_gb=0.05 --vocab_size=4000   # a quick look

Needs about 3.5x the largest size in free disk (raw copy, prepared corpus, examples). Writes
<workdir>/report.md and --json (default <workdir>/report.json): every stage's row, and per stage
the largest size's peak memory and words/s over the smallest's (bounded memory: a peak-RSS ratio
near 1 however much larger the corpus).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time

from benchmarks import harness


def build_raw_corpus(source_files: list[str], directory: str, target_bytes: int) -> dict:
    """Copies of the sample, one file per copy, until `target_bytes`; copy k prefixes the first
    line of every document with "[k] " (different documents for deduplication, same text)."""
    os.makedirs(directory, exist_ok=True)
    texts = [open(f, encoding="utf-8").read() for f in source_files]
    written, copies = 0, 0
    while written < target_bytes:
        path = os.path.join(directory, f"copy-{copies:05d}.txt")
        with open(path, "w", encoding="utf-8") as out:
            for text in texts:
                for doc in text.split("\n\n"):
                    doc = doc.strip("\n")
                    if doc:
                        out.write(f"[{copies}] {doc}\n\n")
        written += os.path.getsize(path)
        copies += 1
    return {"copies": copies, "bytes": written}


def run_measured(cmd: list[str]) -> dict:
    """Runs `cmd`, sampling the RSS of it and all its descendants; returns wall time, the peak
    of their sum and of the largest single process, and stdout."""
    import psutil
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=harness.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    parent = psutil.Process(proc.pid)
    peak_tree = peak_single = 0
    while proc.poll() is None:
        try:
            rss = [p.memory_info().rss for p in [parent, *parent.children(recursive=True)]]
        except psutil.Error:
            rss = []
        if rss:
            peak_tree, peak_single = max(peak_tree, sum(rss)), max(peak_single, max(rss))
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return {"wall_s": time.time() - start, "peak_rss_tree_gb": peak_tree / 2**30,
            "peak_rss_process_gb": peak_single / 2**30, "stdout": out}


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--sizes_gb", default="0.3,3")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=32, help="prepare_corpus output shards")
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--sample_sentences", type=int, default=2_000_000)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--keep", action="store_true", help="keep each size's outputs (default: removed after)")
    parser.add_argument("--build_only", action="store_true", help="only build the repeated raw corpora")
    args = parser.parse_args()
    print(harness.line(), flush=True)  # ratios differ between CPUs
    sources = sorted(glob.glob(os.path.join(args.data, "id_corpus_sample", "*.txt")))
    if not sources:
        sys.exit(f"no corpus at {args.data}/id_corpus_sample")
    rows = []
    for size in (float(s) for s in args.sizes_gb.split(",")):
        root = os.path.join(args.workdir, f"{size:g}gb")
        raw_dir = os.path.join(args.workdir, f"raw_{size:g}gb")  # kept between runs: not a measured stage
        raw_done = os.path.join(raw_dir, "done.json")
        if os.path.exists(raw_done):
            with open(raw_done) as f:
                raw = json.load(f)
        else:
            shutil.rmtree(raw_dir, ignore_errors=True)
            raw = build_raw_corpus(sources, raw_dir, int(size * 1e9))
            with open(raw_done, "w") as f:
                json.dump(raw, f)
        if args.build_only:
            continue
        shutil.rmtree(root, ignore_errors=True)
        corpus, vocab, examples = (os.path.join(root, d) for d in ("corpus", "vocab", "examples"))
        py = [sys.executable, "-m"]
        stages = {
            "prepare_corpus": py + ["pretrain.prepare_corpus", f"--inputs={raw_dir}/copy-*.txt", f"--output_dir={corpus}",
                                    f"--shards={args.shards}", f"--workers={args.workers}", "--lines_are_sentences"],
            "build_vocab": py + ["pretrain.build_vocab", f"--corpus={corpus}/corpus-*.txt", f"--output_dir={vocab}",
                                 f"--vocab_size={args.vocab_size}", f"--sample_sentences={args.sample_sentences}"],
            "create_examples": py + ["pretrain.create_examples", f"--corpus={corpus}/corpus-*.txt",
                                     f"--vocab_dir={vocab}", f"--output_dir={examples}",
                                     f"--max_seq_length={args.max_seq_length}", f"--workers={args.workers}"],
        }
        results = {}
        for name, cmd in stages.items():
            results[name] = run_measured(cmd)
            print(f"{size:g} GB {name}: {results[name]['wall_s']:.1f} s, peak RSS {results[name]['peak_rss_tree_gb']:.2f} GB",
                  flush=True)
        with open(os.path.join(examples, "examples.json")) as f:
            meta = json.load(f)
        words = meta["words"]
        for name, r in results.items():
            r.pop("stdout")
            rows.append({"size_gb": size, "raw_bytes": raw["bytes"], "copies": raw["copies"], "stage": name,
                         "words": words, "words_per_s": words / r["wall_s"], **r,
                         **({"examples": meta["counts"]} if name == "create_examples" else {})})
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.build_only:
        return
    ratios = {}
    sizes = sorted({r["size_gb"] for r in rows})
    if len(sizes) > 1:
        for stage in ("prepare_corpus", "build_vocab", "create_examples"):
            small, large = (next(r for r in rows if r["stage"] == stage and r["size_gb"] == s) for s in (sizes[0], sizes[-1]))
            ratios[f"{stage}_{sizes[-1]:g}gb_over_{sizes[0]:g}gb_peak_rss"] = (large["peak_rss_tree_gb"]
                                                                              / small["peak_rss_tree_gb"])
            ratios[f"{stage}_{sizes[-1]:g}gb_over_{sizes[0]:g}gb_words_per_s"] = large["words_per_s"] / small["words_per_s"]
    harness.write_result(args.json or os.path.join(args.workdir, "report.json"), {"rows": rows}, ratios=ratios)
    lines = [f"Command: `{harness.command()}` ({os.cpu_count()} cores)", "",
             "| corpus | words | stage | wall time | words/s | peak RSS, all processes | peak RSS, largest process |",
             "|---|---|---|---|---|---|---|"]
    # build_vocab reads only its sample: its words/s is the corpus's words over its wall time.
    sampled = f" (trains on a {args.sample_sentences:,}-line sample)" if args.sample_sentences else ""
    for r in rows:
        lines.append(f"| {r['raw_bytes'] / 1e9:.2f} GB | {r['words'] / 1e6:.0f}M | {r['stage']} | {r['wall_s']:.0f} s | "
                     f"{r['words_per_s'] / 1e6:.2f}M{sampled if r['stage'] == 'build_vocab' else ''} | "
                     f"{r['peak_rss_tree_gb']:.2f} GB | {r['peak_rss_process_gb']:.2f} GB |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.workdir, "report.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
