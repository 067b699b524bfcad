"""Experiments of past issues, run as modules from the repository root
(`python -m benchmarks.experiments.NAME --help`); their results and readings live in docs/:

    pretrain_recipe_search      one cell of the from-scratch recipe search (issue 27)
    pretrain_vs_transformers    the cpu_learn recipe beside transformers' BertForMaskedLM (issue 27)
    electra_vs_bert             ELECTRA-small against the cpu_learn BERT at the same wall time (issue 27)
    downstream_gain             fine-tuning a pretrained export against random initialisation (issue 27)
    mlm_plateau_toy             the MLM plateau on a toy task: nli-jax against transformers
    pretrain_id_corpus          a small BERT pretrained on id_corpus_sample, then fine-tuned
    probe_pretrained            what a pretrained encoder learned: a context check and linear probes
    continued_pretraining_gain  MiniLM-L6 continued on Indonesian text, and what it buys downstream
    dynamics_and_calibration_indonli  data maps under label noise, calibration, the cost of recording
    new_languages_decay         NusaX's local languages taught in a WSD decay, vocabulary extended or not (issue 52)

docs/pretraining_id_corpus_sample.md, docs/continued_pretraining_id_corpus.md and
docs/training_dynamics_and_calibration.md give their results.
"""
