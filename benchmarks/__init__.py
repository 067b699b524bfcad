"""Performance benchmarks of nli-jax, each against its peer in the same run, run as modules from the
repository root (`python -m benchmarks.NAME --help` for each one's flags and defaults):

    mlm_train_step           the loop's own MLM train step vs transformers' PyTorch eager
    device_check             the loop's bf16 steps on one GPU / TPU chip: tokens/s, MFU, vs PyTorch there
    encoder_vs_torch         a checkpoint's forward (evaluation step; Python API) and forward + backward vs PyTorch
    finetune_vs_transformers IndoNLI / NERP fine-tuning end to end vs a transformers + PyTorch loop
    input_pipeline           corpus tokenisation and masked pretraining batches vs transformers' collator
    bucket_padding           padded tokens per real token: length buckets vs padding to max_seq_length
    dynamics_cost            the loop's train step with and without recording training dynamics
    compilation_cache        a fine-tuning command's compilation: cold, rerun, a sweep's next cell
    corpus_at_scale          corpus preparation at Indo4B scale: wall time, words/s, peak memory
    sharded_init_memory      peak host memory of creating a model: fsdp vs data parallelism
    multiprocess_steps       steps/s of a 2-process CPU run (to compare code versions)
    attention_tpu_compile    splash vs plain attention, compiled for a TPU topology on this host
    tpu_compile_scan_remat   IndoBERT-large compiled for a v3-8: scanned layers x remat policies
    tpu_compile_table        every shipped recipe through the TPU compiler (launch.compile)

benchmarks.harness is what they share: the machine description printed with every figure, the
timing of repeated calls and the JSON result. benchmarks.experiments holds the experiments of past
issues (pretraining recipes, probes, gains downstream), run the same way; their results and
readings are in docs/.
"""
