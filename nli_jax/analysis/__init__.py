"""Analyses of corpora and of finished runs, each a module of this package with `define_flags()`
and `main(argv)`, run as `python -m nli_jax.analysis <name> [flags]` (docs/extending.md):

    artifacts    annotation artifacts of an NLI corpus: label-word PMI, premise-hypothesis
                 overlap, hypothesis length per label, a hypothesis-only run's accuracy per
                 label, category and tag (the default: `python -m nli_jax.analysis --task=...`)
"""
