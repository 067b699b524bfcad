"""Masked-LM pretraining (+ NSP for BERT, SOP for ALBERT) as a task of the shared loop.

Data: array_record segment pairs from nli_jax.pretraining.examples (built from
`pretrain.corpus` into <workdir>/examples when `pretrain.examples_dir` is empty), masked on the
fly. Loss: MLM cross-entropy at the gathered masked positions (mean over masked tokens) plus the
sentence loss (mean over pairs). Evaluation on held-out documents: MLM and sentence accuracy.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from nli_jax import storage
from nli_jax.data.pipeline import Subset
from nli_jax.errors import RunError
from nli_jax.losses import argmax_hits, weighted_accuracy, weighted_cross_entropy
from nli_jax.models import ForMaskedLM, families
from nli_jax.plan import BatchPlan, DataPlan, ModelPlan, PretrainPlan, TaskOptions, option
from nli_jax.pretraining.continued import check_checkpoint, vocabulary_dir
from nli_jax.pretraining.examples import ExampleSource, check_vocabulary, create_examples, vocabulary_fingerprint
from nli_jax.pretraining.masking import MaskedBatching, MaskingConfig, MaskingRule, continuation_table, ngram_span_lengths
from nli_jax.pretraining.mixture import (MixtureSource, TaggedConcatenation, corpus_globs, mixture_problems,
                                         mixture_probabilities, named_corpora, parse_weights)
from nli_jax.pretraining.vocab_extension import NEW_TOKEN_INITS
from nli_jax.tasks.base import Task, register
from nli_jax.workdir import has_trained_state


log = logging.getLogger("nli_jax")


def _corpus_files(patterns) -> list[str]:
    """The files the corpus globs match (local or gs://), sorted, each through the read gate (a
    FIFO or device among them would never end a read)."""
    files = sorted({f for pattern in patterns if pattern for f in storage.glob(pattern)})
    return [storage.readable_file(f, "corpus file") for f in files]


@dataclasses.dataclass(frozen=True)
class MaskingOptions(TaskOptions):
    """What every masking objective's options have; a subclass adds its own and says, in
    `masking_rule`, which rule (nli_jax.pretraining.masking.MaskingRule) they make."""
    whole_word: bool = option(False)  # units are whole words (a token and its "##" pieces)
    mask_prob: float = option(0.15, low=0.0, high=1.0, low_open=True, high_open=True)
    max_predictions: int = option(20, low=1)  # masked tokens per sequence at most (20 at 128, 80 at 512)
    random_token_low: int = option(0, low=0)  # random replacements drawn from [low, vocab size)
    # The held-out split's masking rate (0: the training rate and cap). Runs trained at different
    # rates (BERT's 15%, MosaicBERT's 30%) are scored on the same held-out masks when they give the same one.
    heldout_mask_prob: float = option(0.0, low=0.0, high=1.0, high_open=True)
    # Continued from model.init with a tokenizer that extends its vocabulary (pretrain.extend_vocab):
    # each new token's embedding, decoder row and bias the mean of those of the old tokenizer's
    # pieces for its string (IndoBERTweet), or "random" (BERT's initialisation), for comparison.
    new_token_init: str = option("mean", choices=NEW_TOKEN_INITS)

    def masking_rule(self) -> MaskingRule:
        raise NotImplementedError(f"{type(self).__name__} names no masking rule")

    def heldout_masking_rule(self, max_seq_length: int) -> MaskingRule:
        """The training rule, or at `heldout_mask_prob` with the cap that rate fills at the length
        (not the training's cap), so runs given the same held-out rate and length draw the same masks."""
        rule, rate = self.masking_rule(), self.heldout_mask_prob
        if not rate:
            return rule
        return dataclasses.replace(rule, mask_prob=rate, max_predictions=math.ceil(round(rate * max_seq_length, 6)))


@dataclasses.dataclass(frozen=True)
class MaskedLMOptions(MaskingOptions):
    """BERT's and ALBERT's masking: single tokens, or whole-word n-grams up to 3, p(n) ∝ 1/n."""
    max_ngram: int = option(1, low=1)  # spans of n <= max_ngram units, p(n) ∝ 1/n (ALBERT: 3)

    def masking_rule(self) -> MaskingRule:
        return MaskingRule(unit="word" if self.whole_word else "token", span_lengths=ngram_span_lengths(self.max_ngram),
                           mask_prob=self.mask_prob, max_predictions=self.max_predictions,
                           random_token_low=self.random_token_low)


class Pretraining(Task):
    name = "pretraining"
    primary_metric = "mlm_accuracy"
    reports_final_parameters = True  # the export is the final step's encoder; results describe it
    tracked_metrics = ("mask_input_accuracy", "mask_input_constant_baseline")
    training_scalars = (("mlm_accuracy", "mlm_correct", "mlm_weight"), ("mlm_loss", "mlm_loss_sum", "mlm_weight"),
                        ("sentence_accuracy", "sentence_correct", "sentence_weight"),
                        ("sentence_loss", "sentence_loss_sum", "sentence_weight"))
    validation_split = "heldout"
    # Checkpoints (model.init) this objective continues, and what it trains them as. None: those
    # `continuable()` derives from the family table.
    continuable_model_types: tuple[str, ...] | None = None
    objective = "MLM (with an NSP/SOP head: BERT / ALBERT, exported as *ForPreTraining)"

    def __init__(self, data: DataPlan, pretrain: PretrainPlan, model: ModelPlan, options: MaskingOptions):
        super().__init__(data, options)
        self.pretrain, self.model = pretrain, model
        self.masking = options.masking_rule()
        self.heldout_masking = options.heldout_masking_rule(data.max_seq_length)
        try:
            corpora = named_corpora(pretrain.corpus)
        except ValueError:  # refused by plan_problems
            corpora = None
        # A mixture's held-out MLM accuracy per corpus (mlm_accuracy_<name>) in the history and TensorBoard.
        self.corpus_names = tuple(corpora or ())
        self.tracked_metrics = type(self).tracked_metrics + tuple(f"mlm_accuracy_{n}" for n in self.corpus_names)

    def continuable(self) -> tuple[str, ...]:
        """The model_types a model.init may have: BERT and ALBERT (transformers' *ForPreTraining
        names our MLM and sentence heads), and without a sentence task every family whose masked-LM
        head is its own (nli_jax.models.families: `heads["masked_lm"]`, e.g. ModernBERT's
        *ForMaskedLM); `continuable_model_types` when an objective names its own."""
        if self.continuable_model_types is not None:
            return self.continuable_model_types
        own = () if self.pretrain.sentence_task != "none" else tuple(
            t for t in families.model_types() if "masked_lm" in families.get(t).heads)
        return tuple(dict.fromkeys(("bert", "albert") + own))

    def new_token_init(self) -> str:
        return self.options.new_token_init

    def plan_problems(self, plan):
        p = self.pretrain
        problems = mixture_problems(p.corpus, p.corpus_weights, p.corpus_alpha, p.examples_dir)
        if self.masking.max_predictions > plan.data.max_seq_length:
            problems.append(f"--config.task_options.max_predictions={self.masking.max_predictions}: more predictions "
                            f"than data.max_seq_length ({plan.data.max_seq_length}) tokens")
        return problems

    # Fixed when the task is bound (tokenizer_values): the masking of its batches, and [MASK]'s id,
    # by which evaluation tells the predictions made at [MASK] inputs.
    masking_config: MaskingConfig | None = None
    heldout_masking_config: MaskingConfig | None = None
    is_continuation: np.ndarray | None = None
    mask_id: int | None = None

    def tokenizer_values(self, tokenizer):
        vocab = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
        cls_id, sep_id, mask_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]"))
        shared = dict(max_seq_length=self.data.max_seq_length, vocab_size=len(vocab), cls_id=cls_id, sep_id=sep_id,
                      mask_id=mask_id, pad_id=pad_id)
        return {"mask_id": mask_id, "is_continuation": continuation_table(vocab),
                "masking_config": MaskingConfig(rule=self.masking, **shared),
                "heldout_masking_config": MaskingConfig(rule=self.heldout_masking, **shared)}

    def stale_settings(self, directory: str, corpus_files: list[str]) -> list[str]:
        """Settings that differ between examples built in the workdir and this run's ([] if none,
        or no examples yet). Keys an older examples.json lacks are not compared."""
        meta_path = os.path.join(directory, "examples.json")
        if not storage.isfile(meta_path):
            return []
        try:
            meta = json.loads(storage.read_text(meta_path))
        except ValueError:
            return ["examples.json unreadable"]
        p = self.pretrain
        tokenizer = vocabulary_dir(self.model)
        expected = {"max_seq_length": self.data.max_seq_length, "short_seq_prob": p.short_seq_prob,
                    "sentence_task": p.sentence_task, "dupe_factor": p.dupe_factor, "seed": p.data_seed,
                    "heldout_permille": p.heldout_permille,
                    "vocab_dir": storage.origin(tokenizer) if tokenizer else None,
                    "vocab_fingerprint": vocabulary_fingerprint(tokenizer) if tokenizer else None,
                    "corpus": [storage.origin(f) for f in corpus_files]}
        return [f"{k}: {meta[k]!r} -> {v!r}" for k, v in expected.items() if k in meta and meta[k] != v]

    def load(self, workdir=None):
        p = self.pretrain
        check_checkpoint(self.model, building_examples=not p.examples_dir, model_types=self.continuable(),
                         objective=self.objective)
        corpora = named_corpora(p.corpus)
        if corpora is None:
            directory = p.examples_dir or self._built_examples(workdir, "examples", p.corpus)
            train, heldout = self._splits_of(directory, f"pretrain.corpus={list(p.corpus)}")
            return {"train": train, "heldout": heldout}
        splits = {name: self._splits_of(self._built_examples(workdir, os.path.join("examples", name), globs),
                                        f"corpus {name!r} of pretrain.corpus ({list(globs)})")
                  for name, globs in corpora.items()}
        probabilities = mixture_probabilities({name: len(train) for name, (train, _) in splits.items()},
                                              parse_weights(p.corpus_weights), p.corpus_alpha)
        train = MixtureSource({name: train for name, (train, _) in splits.items()}, probabilities)
        log.info("corpus mixture: %s", ", ".join(
            f"{name} {len(splits[name][0])} examples, p={probabilities[name]:.3f} ({share:.1%} of the {len(train)} "
            "per epoch)" for name, share in train.shares().items()))
        return {"train": train, "heldout": TaggedConcatenation({name: heldout for name, (_, heldout) in splits.items()})}

    def _built_examples(self, workdir, subdirectory: str, patterns) -> str:
        """<workdir>/<subdirectory> holding the examples of the corpus `patterns` name, built
        there when absent (again when built with other settings and nothing was trained on them)."""
        p = self.pretrain
        if not workdir:
            raise RunError("pretrain.examples_dir is empty and no workdir was given to build the examples in")
        directory = os.path.join(workdir, subdirectory)
        files = _corpus_files(patterns)
        stale = self.stale_settings(directory, files)
        if stale:
            if has_trained_state(workdir):
                raise RunError(f"{directory} was built with other settings ({'; '.join(stale)}) and this "
                                 f"workdir has trained on them: use a new --workdir")
        if stale and jax.process_index() == 0:
            # Derived data of an earlier attempt in this workdir (config.json guards a run that
            # trained): built with other settings, so built again rather than used silently.
            log.warning("%s was built with other settings (%s); building the examples again", directory,
                        "; ".join(stale))
            storage.rmtree(directory)
        if jax.process_count() > 1:  # every process decides on the same (possibly just removed) state
            multihost_utils.sync_global_devices("nli_jax pretraining examples checked")
        if not storage.isfile(os.path.join(directory, "examples.json")):
            if not files:
                raise FileNotFoundError(f"pretrain.corpus matches no files: {list(patterns)}")
            if jax.process_index() == 0:
                create_examples(files, vocabulary_dir(self.model), directory, max_seq_length=self.data.max_seq_length,
                                short_seq_prob=p.short_seq_prob, sentence_task=p.sentence_task,
                                dupe_factor=p.dupe_factor, seed=p.data_seed, workers=p.workers,
                                heldout_permille=p.heldout_permille, progress=False)
            if jax.process_count() > 1:
                multihost_utils.sync_global_devices("nli_jax pretraining examples")
        return directory

    def _splits_of(self, directory: str, source: str):
        """(training examples, the first pretrain.heldout_examples held-out ones) of an examples
        directory, checked against the run's vocabulary, length and sentence task."""
        p = self.pretrain
        train = ExampleSource(directory, "train")
        meta = train.meta
        check_vocabulary(directory, meta, vocabulary_dir(self.model))
        if len(train) == 0:
            source = f"pretrain.examples_dir={p.examples_dir}" if p.examples_dir else source
            raise RunError(f"{directory} holds no training examples ({source}): the corpus files are empty, or every "
                           "document went to the held-out split; prepare the corpus with python -m "
                           "pretrain.prepare_corpus (one sentence per line, a blank line between documents)")
        if meta["max_seq_length"] != self.data.max_seq_length:
            raise RunError(f"{directory} holds examples of length {meta['max_seq_length']} but data.max_seq_length "
                             f"is {self.data.max_seq_length}: build the phase's examples with that length")
        if meta["sentence_task"] != p.sentence_task:
            raise RunError(f"{directory} was built with sentence_task {meta['sentence_task']!r}, config says "
                             f"{p.sentence_task!r}")
        heldout = ExampleSource(directory, "heldout")
        return train, Subset(heldout, range(min(len(heldout), p.heldout_examples)))

    def possible_splits(self):
        return {"train", "heldout"}

    def input_files(self, workdir=None):
        """The prepared corpus when the examples are built in the workdir, else the prebuilt
        examples' files."""
        p = self.pretrain
        if p.examples_dir:
            directory = p.examples_dir
            return [os.path.join(directory, f) for f in storage.listdir(directory)
                    if storage.isfile(os.path.join(directory, f))]
        return _corpus_files(corpus_globs(p.corpus))

    def model_class_and_kwargs(self):
        return ForMaskedLM, {"sentence_head": self.pretrain.sentence_task != "none"}

    def encoder(self, tokenizer):
        def encode(example):  # records are decoded by ExampleSource; masking happens per batch
            return dict(example, weight=np.float32(1.0))
        return encode

    def example_of_length(self, length):
        body = length - 3  # [CLS] A [SEP] B [SEP]
        return {"idx": 0, "label": 0, "a": np.full(body // 2, 5, np.int32), "b": np.full(body - body // 2, 5, np.int32),
                "weight": np.float32(1.0)}

    def batching(self, tokenizer, batch: BatchPlan) -> MaskedBatching:
        if self.masking_config is None:
            raise RuntimeError(f"task {self.name!r}: batching needs the bound task (Task.bind)")
        # This process's rows of each global batch (random draws are made for the global batch).
        return MaskedBatching(self.masking_config, self.is_continuation,
                              row_offset=batch.process_index * batch.local_batch,
                              global_rows=batch.local_batch * batch.processes,
                              evaluation_config=self.heldout_masking_config)

    def _outputs(self, model, batch, deterministic):
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                     masked_positions=batch["masked_positions"], deterministic=deterministic)

    def loss_normalizers(self, batch):
        return {"examples": jnp.sum(batch["weight"]),
                "masked_tokens": jnp.sum(batch["masked_weights"] * batch["weight"][:, None])}

    def loss(self, model, batch, deterministic):
        out = self._outputs(model, batch, deterministic)
        weights = batch["masked_weights"] * batch["weight"][:, None]
        mlm_sum, mlm_w = weighted_cross_entropy(out["mlm_logits"], batch["masked_ids"], weights)
        mlm_correct, _ = weighted_accuracy(out["mlm_logits"], batch["masked_ids"], weights)
        examples = jnp.sum(batch["weight"])
        # BERT's objective: mean MLM loss over the global batch's masked tokens + mean sentence
        # loss over its pairs. Under accumulation each micro-batch divides by the global counts.
        totals = batch.get("loss_normalizers") or {"examples": examples, "masked_tokens": mlm_w}
        global_examples = jnp.maximum(totals["examples"], 1.0)
        objective = mlm_sum / jnp.maximum(totals["masked_tokens"], 1.0)
        sums = {"mlm_loss_sum": mlm_sum, "mlm_weight": mlm_w, "mlm_correct": mlm_correct}
        if "sentence_logits" in out:
            s_sum, s_w = weighted_cross_entropy(out["sentence_logits"], batch["sentence_label"], batch["weight"])
            s_correct, _ = weighted_accuracy(out["sentence_logits"], batch["sentence_label"], batch["weight"])
            objective = objective + s_sum / global_examples
            sums.update(sentence_loss_sum=s_sum, sentence_weight=s_w, sentence_correct=s_correct)
        # (this micro-batch's share of the objective) x global examples, weighted by its examples:
        # the loop's sum over micro-batches divided by the summed weight is the objective itself.
        return objective * global_examples, examples, sums

    def predict(self, model, batch):
        out = self._outputs(model, batch, True)
        hit = argmax_hits(out["mlm_logits"], batch["masked_ids"]) * batch["masked_weights"]
        pred = {"mlm_correct": hit.sum(-1), "mlm_count": batch["masked_weights"].sum(-1)}
        if self.mask_id is not None:
            # The predictions whose input is [MASK] (80% of them): only context answers these; the
            # 10% kept tokens are answered by copying the input.
            at_mask = (jnp.take_along_axis(batch["input_ids"], batch["masked_positions"], axis=1) == self.mask_id
                       ) & (batch["masked_weights"] > 0)
            pred.update(mask_correct=(hit * at_mask).sum(-1), mask_count=at_mask.sum(-1).astype(jnp.float32),
                        mask_targets=jnp.where(at_mask, batch["masked_ids"], -1))
        if "sentence_logits" in out:
            pred["sentence_correct"] = (jnp.argmax(out["sentence_logits"], -1) == batch["sentence_label"]).astype(jnp.float32)
        return pred

    def report(self, split, examples, predictions):
        correct = float(np.sum(predictions["mlm_correct"]))
        count = float(np.sum(predictions["mlm_count"]))
        out = {"mlm_accuracy": correct / max(count, 1.0), "masked_tokens": int(count), "count": len(examples)}
        if "mask_correct" in predictions:
            masked = float(np.sum(predictions["mask_count"]))
            targets = np.asarray(predictions["mask_targets"]).ravel()
            targets = targets[targets >= 0]
            # The best constant prediction at [MASK] inputs: the most frequent target's share.
            most_frequent = np.bincount(targets).max() if targets.size else 0
            out.update(mask_input_accuracy=float(np.sum(predictions["mask_correct"])) / max(masked, 1.0),
                       mask_input_constant_baseline=float(most_frequent) / max(masked, 1.0))
        if "sentence_correct" in predictions:
            out["sentence_accuracy"] = float(np.mean(predictions["sentence_correct"]))
        if self.corpus_names and examples and "corpus" in examples[0]:
            out.update(self.corpus_report(examples, predictions))
            log.info("%s MLM accuracy per corpus: %s", split, ", ".join(
                f"{name} {out[f'mlm_accuracy_{name}']:.4f}" for name in self.corpus_names))
        return out

    def corpus_report(self, examples, predictions) -> dict:
        """A mixture's held-out MLM accuracy and masked tokens per corpus."""
        corpus = np.asarray([int(e["corpus"]) for e in examples])
        correct, count = np.asarray(predictions["mlm_correct"], np.float64), np.asarray(predictions["mlm_count"], np.float64)
        out = {}
        for number, name in enumerate(self.corpus_names):
            mine = corpus == number
            out[f"mlm_accuracy_{name}"] = float(correct[mine].sum() / max(count[mine].sum(), 1.0))
            out[f"masked_tokens_{name}"] = int(count[mine].sum())
        return out

    def prediction_records(self, split, examples, predictions):
        return []  # per-example pretraining predictions are not useful to write


register("pretraining", options=MaskedLMOptions)(
    lambda plan: Pretraining(plan.data, plan.pretrain, plan.model, plan.task_options))
