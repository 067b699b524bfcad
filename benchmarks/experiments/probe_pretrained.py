"""What a (briefly) pretrained encoder has learned, against the same shape from random init.

    python -m benchmarks.experiments.probe_pretrained --export=<pretrain workdir>/export --corpus=<prepared corpus file>

1. Context check: 15% of the tokens of 256 corpus sentences replaced by [MASK] (no 10/10 keep/random
   tokens, so copying the input cannot help): accuracy at those positions, how many distinct tokens
   the model predicts, and the most-frequent-token baseline. A model that predicts one token
   everywhere does not use context yet.
2. Linear probe on EmoT and SmSA (IndoNLU): logistic regression on frozen features (mean-pooled
   last layer, and the pooler output) of the training set, macro-F1 on validation, pretrained vs
   the same shape from random init, or vs --baseline (e.g. the checkpoint a continued pretraining
   run started from). No fine-tuning seeds: the probe is deterministic, so small differences show.

    python -m benchmarks.experiments.probe_pretrained --export=/tmp/cg/pretrain/export --corpus=... \\
        --baseline=<init checkpoint>

--json writes the figures (ratios: the pretrained encoder's probe F1 over the baseline's, per task
and features).
"""
from __future__ import annotations

import collections
import csv
import os

import numpy as np

from benchmarks import harness


def context_check(model, tokenizer, lines, seed=0):
    import jax.numpy as jnp
    enc = tokenizer(lines, padding="max_length", truncation=True, max_length=64, return_tensors="np")
    ids, attention = enc["input_ids"], enc["attention_mask"]
    candidates = (attention == 1) & (ids != tokenizer.cls_token_id) & (ids != tokenizer.sep_token_id)
    chosen = candidates & (np.random.default_rng(seed).random(ids.shape) < 0.15)
    masked = np.where(chosen, tokenizer.mask_token_id, ids)
    P = 10
    positions, weights, labels = (np.zeros((len(ids), P), t) for t in (np.int32, np.float32, np.int32))
    for i in range(len(ids)):
        p = np.nonzero(chosen[i])[0][:P]
        positions[i, :len(p)], weights[i, :len(p)], labels[i, :len(p)] = p, 1, ids[i, p]
    out = model(jnp.asarray(masked), jnp.asarray(attention), jnp.zeros_like(jnp.asarray(ids)),
                masked_positions=jnp.asarray(positions), deterministic=True)
    predicted = np.asarray(out["mlm_logits"]).argmax(-1)
    n = weights.sum()
    top_token = collections.Counter(ids[candidates].tolist()).most_common(1)[0][0]
    counts = collections.Counter(predicted[weights > 0].tolist())
    return {"accuracy": float(((predicted == labels) * weights).sum() / n),
            "most_frequent_token_baseline": float(((labels == top_token) * weights).sum() / n),
            "distinct_predictions": len(counts), "predictions": int(n),
            "top_prediction": tokenizer.convert_ids_to_tokens(counts.most_common(1)[0][0]),
            "top_prediction_share": counts.most_common(1)[0][1] / n}


def features(encoder, tokenizer, texts):
    import jax.numpy as jnp
    pooled, mean = [], []
    for i in range(0, len(texts), 128):
        enc = tokenizer(texts[i:i + 128], padding="max_length", truncation=True, max_length=128, return_tensors="np")
        out = encoder(jnp.asarray(enc["input_ids"]), jnp.asarray(enc["attention_mask"]),
                      jnp.zeros_like(jnp.asarray(enc["input_ids"])), deterministic=True)
        h, m = np.asarray(out["hidden_states"]), enc["attention_mask"][..., None]
        pooled.append(np.asarray(out["pooled"]))
        mean.append((h * m).sum(1) / m.sum(1))
    return {"mean": np.concatenate(mean), "pooled": np.concatenate(pooled)}


def main():
    parser = harness.parser(__doc__)
    parser.add_argument("--export", required=True, help="a pretraining run's <workdir>/export")
    parser.add_argument("--corpus", required=True, help="a prepared corpus file (sentences for the context check)")
    parser.add_argument("--data", default=harness.shared_data())
    parser.add_argument("--baseline", default="", help="a Hugging Face directory to compare with (default: random init)")
    parser.add_argument("--tasks", default="emot,smsa")
    parser.add_argument("--limit", type=int, default=0, help="the first N training and validation texts (smoke runs)")
    args = parser.parse_args()
    print(harness.line(), flush=True)  # ratios differ between CPUs
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score

    from nli_jax.checkpoints.hf import load_tokenizer
    from nli_jax.models import EncoderModel, ForMaskedLM, make_rngs

    tokenizer = load_tokenizer(args.export)
    with open(args.corpus, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if len(line.split()) > 8]
    lines = lines[len(lines) // 2:len(lines) // 2 + 256]
    pretrained = ForMaskedLM.from_pretrained(args.export)
    context = context_check(pretrained, tokenizer, lines)
    print("context check (pretrained):", context)

    readers = {"emot": ("emot_emotion-twitter", "csv"), "smsa": ("smsa_doc-sentiment-prosa", "tsv")}

    def read(task, split):
        folder, kind = readers[task]
        path = os.path.join(args.data, "indonlu", folder, f"{split}_preprocess.{kind}")
        with open(path, encoding="utf-8", newline="") as f:
            if kind == "csv":  # EmoT: header, then label,tweet
                rows = [(r[1], r[0]) for r in list(csv.reader(f))[1:]]
            else:  # SmSA: text<TAB>label
                rows = [tuple(line.rstrip("\n").rsplit("\t", 1)) for line in f if line.strip()]
        rows = rows[:args.limit] if args.limit else rows
        return [text for text, _ in rows], [label for _, label in rows]

    encoder = EncoderModel.from_pretrained(args.export)
    if args.baseline:
        encoders = {"pretrained": (encoder, tokenizer),
                    "baseline": (EncoderModel.from_pretrained(args.baseline), load_tokenizer(args.baseline))}
    else:
        encoders = {"pretrained": (encoder, tokenizer), "random init": (EncoderModel(encoder.config, rngs=make_rngs(0)), tokenizer)}
    probes = {}
    for task in args.tasks.split(","):
        if not os.path.isdir(os.path.join(args.data, "indonlu", readers[task][0])):
            print(f"no {task} under {args.data}/indonlu: its probe skipped")
            continue
        (train_x, train_y), (val_x, val_y) = read(task, "train"), read(task, "valid")
        for name, (model, tok) in encoders.items():
            a, b = features(model, tok, train_x), features(model, tok, val_x)
            for kind in ("mean", "pooled"):
                mu, sd = a[kind].mean(0), a[kind].std(0) + 1e-6
                clf = LogisticRegression(max_iter=2000).fit((a[kind] - mu) / sd, train_y)
                f1 = f1_score(val_y, clf.predict((b[kind] - mu) / sd), average="macro")
                probes.setdefault(f"{task}/{kind}", {})[name] = 100 * f1
                print(f"{task} linear probe, {kind} features, {name}: validation macro-F1 {100 * f1:.2f}", flush=True)
    other = "baseline" if args.baseline else "random init"
    harness.write_result(args.json, {"export": args.export, "baseline": args.baseline or "random init",
                                     "context_check": context, "probe_macro_f1": probes},
                         ratios={f"{key}_pretrained_over_{other.replace(' ', '_')}_f1": f1s["pretrained"]
                                 / max(f1s[other], 1e-9) for key, f1s in probes.items()})


if __name__ == "__main__":
    main()
