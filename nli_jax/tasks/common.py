"""Encodings, losses and predictions shared by task families.

Sentence(-pair) classification (NLI, EmoT, SmSA, WReTE), multi-aspect classification (CASA,
HoASA) and word-level labelling (POS, NER, keyphrases, FacQA) differ only here.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np

from nli_jax.losses import weighted_accuracy, weighted_cross_entropy
from nli_jax.models import ForMultiAspectClassification, ForSequenceClassification, ForTokenClassification
from nli_jax.models.encoder import example_tokens
from nli_jax.plan import TaskOptions, option
from nli_jax.tasks.base import PER_EXAMPLE, Task


# Characters per token a text is first cut to (then doubled until the cut holds enough tokens).
CUT_CHARS_PER_TOKEN = 8
_LAST_SPACE = re.compile(r"\s\S*$")


def bounded_text(tokenizer, text: str, max_length: int) -> str:
    """`text` cut, before it is tokenised whole, to what `max_length` tokens can use: to
    CUT_CHARS_PER_TOKEN x max_length characters (back to a space, so no word is split), kept
    when it still holds max_length tokens, else a longer cut is tried. A 16,000-word premise then
    costs what a short one does, and its first max_length tokens are those of the whole text
    (a word's tokens do not depend on the words after it)."""
    budget = CUT_CHARS_PER_TOKEN * max(max_length, 32)
    while len(text) > budget:
        cut = text[:budget + 1]  # the character after the budget tells whether a word is cut
        space = _LAST_SPACE.search(cut)
        if space is not None and space.start() > budget // 2:
            cut = cut[:space.start()]
        else:
            cut = cut[:budget]  # one long word, or a script without spaces (each character a token)
        if len(tokenizer(cut, add_special_tokens=False, truncation=True, max_length=max_length)["input_ids"]) >= max_length:
            return cut
        budget *= 4
    return text


def encode_text(tokenizer, text_a: str, text_b: str | None, max_length: int) -> dict:
    """Token ids for one text or a pair; long texts are cut from the longer one first. Each text
    is cut before tokenisation to what max_length tokens can use (bounded_text): equal to
    tokenising it whole, except that when both texts of a pair are longer than max_length, which
    one keeps the odd token of an odd budget follows the cut lengths."""
    text_a = bounded_text(tokenizer, text_a, max_length)
    text_b = None if text_b is None else bounded_text(tokenizer, text_b, max_length)
    if text_b is None:
        enc = tokenizer(text_a, truncation=True, max_length=max_length)
    else:
        enc = tokenizer(text_a, text_b, truncation="longest_first", max_length=max_length)
    ids = np.asarray(enc["input_ids"], np.int32)
    check_length(len(ids), max_length)
    types = np.asarray(enc.get("token_type_ids") or np.zeros_like(ids), np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types}


def bounded_words(tokenizer, words: list[str], max_length: int) -> list[str]:
    """The words of a tagging example that max_length tokens can reach (the first max_length:
    every later word is past them), each cut as bounded_text cuts a text."""
    return [bounded_text(tokenizer, w, max_length) for w in words[:max_length]]


def tokens_of_length(length: int) -> dict:
    """The token fields of an encoded text (pair) of `length` tokens, values arbitrary."""
    ids = np.full(length, 5, np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def packing_fields(batch) -> dict | None:
    """A packed batch's segment_ids, position_ids and cls_index (pipeline.Batching.pack), which
    go to the model as `packing`; None for a padded batch."""
    return {k: batch[k] for k in ("segment_ids", "position_ids", "cls_index")} if "segment_ids" in batch else None


def sequence_logits(model, batch, deterministic: bool):
    """Per-example logits of a padded batch, or of a packed one."""
    packing = packing_fields(batch)
    return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], deterministic=deterministic,
                 packing=packing)


def outcomes(logits, labels) -> dict:
    """Per prediction: the gold label's probability and whether the top label is the gold one
    (the quantities of dataset cartography)."""
    probabilities = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    gold = jnp.take_along_axis(probabilities, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    return {"gold_probability": gold, "correct": (jnp.argmax(logits, -1) == labels).astype(jnp.float32)}


def check_length(length: int, max_length: int) -> None:
    """Tokenizers return an untruncated encoding (with a warning) when max_length is shorter
    than their special tokens: that must never reach the model as if it were truncated."""
    if length > max_length:
        raise ValueError(f"an example encodes to {length} tokens, more than data.max_seq_length={max_length}: "
                         "the tokenizer cannot truncate it that far")


class ClassificationTask(Task):
    """One label per example from the pooled encoder output."""
    labels: tuple[str, ...] = ()
    packs_examples = True
    records_dynamics = True

    def model_class_and_kwargs(self):
        return ForSequenceClassification, {"num_labels": len(self.labels)}

    def example_of_length(self, length):
        return {**tokens_of_length(length), "label": np.int32(0), "idx": np.int32(0), "weight": np.float32(1.0)}

    def loss(self, model, batch, deterministic):
        logits = sequence_logits(model, batch, deterministic)
        loss_sum, weight = weighted_cross_entropy(logits, batch["label"], batch["weight"])
        correct, _ = weighted_accuracy(logits, batch["label"], batch["weight"])
        return loss_sum, weight, {"correct": correct, PER_EXAMPLE: outcomes(logits, batch["label"])}

    def predict(self, model, batch):
        logits = sequence_logits(model, batch, deterministic=True)
        return {"prediction": jnp.argmax(logits, -1), "probabilities": jax.nn.softmax(logits, axis=-1),
                "logits": logits}

    def gold_labels(self, example):
        return [self.label_name(example)]

    def label_index(self, example) -> int | None:
        """The gold label's index, None for unlabelled input."""
        label = example["label"]
        if label is None or (isinstance(label, (int, np.integer)) and label < 0):
            return None
        return int(label) if isinstance(label, (int, np.integer)) else self.labels.index(label)

    def calibration_inputs(self, examples, predictions):
        gold = [self.label_index(e) for e in examples]
        if not examples or any(g is None for g in gold):
            return None
        return np.stack([np.asarray(x) for x in predictions["logits"]]), np.asarray(gold)

    def prediction_records(self, split, examples, predictions):
        return [{"split": split, "idx": e["idx"], "id": e.get("id", e["idx"]), "label": self.label_name(e),
                 "prediction": self.labels[int(p)], "probabilities": [round(float(x), 6) for x in probs]}
                for e, p, probs in zip(examples, predictions["prediction"], predictions["probabilities"])]

    def label_name(self, example) -> str | None:
        label = example["label"]
        if label is None or (isinstance(label, int) and label < 0):  # unlabelled input (predict)
            return None
        return self.labels[label] if isinstance(label, int) else label


class MultiAspectTask(Task):
    """One softmax per aspect; loss averaged over (example, aspect) pairs. An example's training
    dynamics average its aspects (the gold probability and correctness over them); calibration
    counts every (example, aspect) prediction."""
    aspects: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    packs_examples = True
    records_dynamics = True

    def model_class_and_kwargs(self):
        return ForMultiAspectClassification, {"num_aspects": len(self.aspects), "num_labels": len(self.labels)}

    def example_of_length(self, length):
        return {**tokens_of_length(length), "labels": np.zeros(len(self.aspects), np.int32), "idx": np.int32(0),
                "weight": np.float32(1.0)}

    def loss(self, model, batch, deterministic):
        logits = sequence_logits(model, batch, deterministic)
        weights = jnp.broadcast_to(batch["weight"][:, None], batch["labels"].shape)
        loss_sum, weight = weighted_cross_entropy(logits, batch["labels"], weights)
        correct, _ = weighted_accuracy(logits, batch["labels"], weights)
        per_example = {k: v.mean(-1) for k, v in outcomes(logits, batch["labels"]).items()}
        return loss_sum, weight, {"correct": correct, PER_EXAMPLE: per_example}

    def predict(self, model, batch):
        logits = sequence_logits(model, batch, deterministic=True)
        return {"prediction": jnp.argmax(logits, -1), "logits": logits}

    def gold_labels(self, example):
        return list(example["labels"] or [])

    def calibration_inputs(self, examples, predictions):
        if not examples or any(e["labels"] is None for e in examples):
            return None
        index = {name: i for i, name in enumerate(self.labels)}
        logits = np.concatenate([np.asarray(x) for x in predictions["logits"]])  # [examples x aspects, labels]
        return logits, np.asarray([index[label] for e in examples for label in e["labels"]])


@dataclasses.dataclass(frozen=True)
class TaggingOptions(TaskOptions):
    word_alignment: str = option("average", choices=("average", "first"), model_input=True)


class TaggingTask(Task):
    """Labels on words, predicted from sub-word tokens.

    `task_options.word_alignment` (TaggingOptions): "first" labels each word from its first sub-token; "average" (the
    IndoNLU framework's choice) from the mean of its sub-token vectors. Both are one matrix M
    [words, tokens] per example: word logits = M @ token logits / row sums (the classifier is
    affine, so averaging logits equals classifying the averaged vector).
    """
    labels: tuple[str, ...] = ()
    question_field: str | None = None  # FacQA: the question is the first segment, labels on the passage
    # Packed rows (data.packing): the word alignment and labels stay one row per example, and each
    # example's token logits are read back from its segment (models.encoder.example_tokens).
    packs_examples = True
    per_example_fields = ("word_index", "word_labels", "word_mask")

    def model_class_and_kwargs(self):
        return ForTokenClassification, {"num_labels": len(self.labels)}

    def pad_values(self, tokenizer):
        return {**super().pad_values(tokenizer), "word_index": -1, "word_labels": 0, "word_mask": 0}

    def example_of_length(self, length):
        words = length - 2  # one sub-token per word between [CLS] and [SEP]
        return {**tokens_of_length(length), "word_index": np.concatenate([[-1], np.arange(words), [-1]]).astype(np.int32),
                "word_mask": np.ones(words, np.float32), "word_labels": np.zeros(words, np.int32),
                "idx": np.int32(0), "weight": np.float32(1.0)}

    def encoder(self, tokenizer):
        max_length, alignment = self.data.max_seq_length, self.options.word_alignment
        label_ids = {name: i for i, name in enumerate(self.labels)}

        def encode(example):
            # Only the first max_length words can be seen (word_mask below), each cut to what
            # max_length tokens can use: a long sentence costs what a short one does.
            words = bounded_words(tokenizer, example["tokens"], max_length)
            if self.question_field:
                enc = tokenizer(bounded_words(tokenizer, example[self.question_field], max_length), words,
                                is_split_into_words=True,
                                truncation="longest_first", max_length=max_length)
                target = 1
            else:
                enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
                target = 0
            word_ids, sequence_ids = enc.word_ids(), enc.sequence_ids()
            word_index = np.full(len(word_ids), -1, np.int32)
            previous = None
            for t, (w, s) in enumerate(zip(word_ids, sequence_ids)):
                if w is None or s != target:
                    previous = None
                    continue
                if alignment == "average" or w != previous:
                    word_index[t] = w
                previous = w
            n_words = min(len(words), max_length)
            word_mask = np.zeros(n_words, np.float32)
            covered = word_index[word_index >= 0]
            word_mask[covered[covered < n_words]] = 1.0
            ids = np.asarray(enc["input_ids"], np.int32)
            check_length(len(ids), max_length)
            return {"input_ids": ids, "attention_mask": np.ones_like(ids),
                    "token_type_ids": np.asarray(enc.get("token_type_ids") or np.zeros_like(ids), np.int32),
                    "word_index": word_index, "word_mask": word_mask,
                    "word_labels": (np.asarray([label_ids[t] for t in example["tags"][:n_words]], np.int32)
                                    if example["tags"] is not None else np.zeros(n_words, np.int32)),
                    "idx": np.int32(example["idx"]), "weight": np.float32(1.0)}
        return encode

    def gold_labels(self, example):
        return list(example["tags"] or [])

    def word_logits(self, model, batch, deterministic):
        packing = packing_fields(batch)
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], deterministic=deterministic,
                       **({"packing": packing} if packing is not None else {}))
        if packing is not None:  # [rows, length, labels] -> [examples, tokens, labels]
            logits = example_tokens(logits, packing["cls_index"], batch["word_index"].shape[1])
        n_words = batch["word_labels"].shape[1]
        membership = (batch["word_index"][:, None, :] == jnp.arange(n_words)[None, :, None]).astype(logits.dtype)
        counts = jnp.maximum(membership.sum(-1, keepdims=True), 1.0)
        return jnp.einsum("bwt,btl->bwl", membership, logits) / counts

    def loss(self, model, batch, deterministic):
        logits = self.word_logits(model, batch, deterministic)
        weights = batch["word_mask"] * batch["weight"][:, None]
        loss_sum, weight = weighted_cross_entropy(logits, batch["word_labels"], weights)
        correct, _ = weighted_accuracy(logits, batch["word_labels"], weights)
        return loss_sum, weight, {"correct": correct}

    def predict(self, model, batch):
        return {"prediction": jnp.argmax(self.word_logits(model, batch, True), -1), "word_mask": batch["word_mask"]}

    def unseen_words(self, examples, predictions) -> tuple[int, int]:
        """(words the encoding could not see, all words): past data.max_seq_length, or with no
        sub-token. They are scored as predicted 'O'."""
        seen = sum(int(np.sum(np.asarray(m) > 0)) for m in predictions["word_mask"])
        total = sum(len(e["tokens"]) for e in examples)
        return total - seen, total

    def predicted_tags(self, example, prediction, word_mask) -> list[str]:
        """Words the encoding could not see (truncated, or no sub-token) are predicted 'O'."""
        fallback = "O" if "O" in self.labels else self.labels[0]
        out = []
        for i in range(len(example["tokens"])):
            seen = i < len(word_mask) and word_mask[i] > 0
            out.append(self.labels[int(prediction[i])] if seen else fallback)
        return out

    def prediction_records(self, split, examples, predictions):
        return [{"split": split, "idx": e["idx"], "tokens": e["tokens"], "tags": e["tags"],
                 "prediction": self.predicted_tags(e, p, m)}
                for e, p, m in zip(examples, predictions["prediction"], predictions["word_mask"])]
