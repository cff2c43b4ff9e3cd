"""The one typed config tree. Every field has its default here and a docstring under it.

A YAML file maps onto `Config`; `rlvr_jax.config.load` validates it (unknown keys, wrong
types and missing required values are errors naming the key and the file).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

REQUIRED: Any = dataclasses.MISSING  # marks a field the YAML must set
DRY_RUN_ONLY = {"dry_run_only": True}
"""Field metadata of keys only `rlvr-train --dry-run`'s memory plan reads (the target machine's
description); every other key is read by the run itself (tests/test_config_keys_read.py)."""


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections LoRA can adapt, by their HF (and PEFT) module names."""


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 0
    """r: rank of the LoRA adapters; 0 = off (the whole policy trains). On, the learner trains
    the adapters only (optimizer state and checkpoints ∝ adapter size), the KL / DPO reference
    is the base with the adapters off, and a weight push moves the adapters alone."""
    alpha: float = 16.0
    """The adapters' output is scaled by alpha / rank (PEFT's `lora_alpha`)."""
    dropout: float = 0.0
    """Dropout on each adapter's input, in the learner's gradient passes only (the old,
    reference and sampler log-probs see none, so keep 0 for RL: the ratio compares them)."""
    targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    """Projections that get adapters, by HF module name (any of q_proj k_proj v_proj o_proj
    gate_proj up_proj down_proj)."""
    base_dtype: Literal["param", "int8"] = "param"
    """Storage of the frozen base's projection kernels: `param` = `model.param_dtype`; `int8`:
    int8 with a scale per layer and output channel (QLoRA-style, via qwix; dequantized in each
    matmul). Embedding, norms and LM head stay in `model.param_dtype`."""


@dataclass(frozen=True)
class ModelConfig:
    path: str = REQUIRED
    """Local directory with an HF checkpoint (config.json + *.safetensors)."""
    tokenizer: str | None = None
    """Local tokenizer directory; defaults to `model.path`."""
    hf_config: dict[str, Any] | None = None
    """Inline HF architecture config. Used when `path` holds no config.json (dry-runs of
    real-scale configs, or building a fresh random model with `create_if_missing`)."""
    create_if_missing: str | None = None
    """`module:function` called as fn(path, cfg) to build the model at `path` when absent
    (the demo builds its tiny base model this way)."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Storage dtype of the policy parameters."""
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of matmuls and activations; the LM head and log-softmax always run in fp32."""
    attention_impl: Literal["auto", "xla", "blockwise", "cudnn", "splash"] = "auto"
    """Learner attention kernel (`rlvr_jax.models.attention`): `xla` materialises [B, T, T]
    masks and [B, N, T, T] scores (the reference); `blockwise` is online-softmax XLA in
    O(T · block) memory; `cudnn` (GPU, bf16) and `splash` (TPU) are fused kernels. `auto`:
    splash on TPU, cuDNN on GPU where it applies, else blockwise."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (`rank: 0` = off): see `docs/lora.md`."""


@dataclass(frozen=True)
class MeshAxes:
    data: int = 1
    """Data-parallel degree (params replicated); -1 takes the devices left over."""
    fsdp: int = 1
    """Fully sharded data-parallel degree; -1 takes the devices left over."""
    tensor: int = 1
    """Tensor-parallel degree (heads / mlp / vocab split); at most one axis may be -1."""


@dataclass(frozen=True)
class DistributedConfig:
    coordinator_address: str | None = None
    """host:port of process 0 for `jax.distributed.initialize`; None reads the environment."""
    num_processes: int | None = None
    """Total processes; None reads the environment (or runs single-process)."""
    process_id: int | None = None
    """This process's index; None reads the environment."""
    initialize: bool = False
    """Call `jax.distributed.initialize` at start (multi-host runs)."""
    transfer_address: str | None = None
    """host:port this process listens on for cross-host device transfers (moving weights
    from the learner to the actor sub-mesh when they span processes); None = off."""


@dataclass(frozen=True)
class MeshConfig:
    num_devices: int = 0
    """Devices used, from the start of `jax.devices()` (0 = all)."""
    actor_devices: int = 0
    """Devices given to the rollout engine (the actor sub-mesh). 0 shares the learner's
    devices (one machine); > 0 splits the device list: the last `actor_devices` go to the
    actors, the rest to the learner."""
    learner: MeshAxes = field(default_factory=lambda: MeshAxes(data=1, fsdp=-1, tensor=1))
    """Axis sizes of the learner sub-mesh (default: FSDP over all its devices)."""
    actor: MeshAxes = field(default_factory=lambda: MeshAxes(data=-1, fsdp=1, tensor=1))
    """Axis sizes of the actor sub-mesh (default: decode slots split over all its devices)."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Multi-host initialisation."""
    hardware: str | None = field(default=None, metadata=DRY_RUN_ONLY)
    """Name of the target hardware (e.g. "TPU v5p-128", "8xH100-80GB"), for the dry-run plan."""
    plan_devices: int = field(default=0, metadata=DRY_RUN_ONLY)
    """Devices the dry-run plan assumes (0 = the devices this process sees)."""
    device_memory_gib: float = field(default=0.0, metadata=DRY_RUN_ONLY)
    """Memory per device the dry-run plan checks against (0 = unknown / not checked)."""


@dataclass(frozen=True)
class SourceConfig:
    path: str = REQUIRED
    """A JSONL or Parquet file, or a TFDS dataset name (with `format: tfds`)."""
    format: Literal["jsonl", "parquet", "tfds", "auto"] = "auto"
    """File format; `auto` goes by the file extension."""
    weight: float = 1.0
    """Mixture weight (normalised over sources)."""
    name: str | None = None
    """Source name in logs and metrics; defaults to the file stem."""
    split: str = "train"
    """TFDS split."""
    data_dir: str | None = None
    """TFDS data directory (local)."""
    domain: str | None = None
    """Default domain for rows that name none."""
    fields: dict[str, str] = field(default_factory=dict)
    """Row field -> the record's column that holds it, for files with their own column names
    (e.g. `{prompt: question, ground_truth: answer}`); row fields: `prompt`, `ground_truth`,
    `verifier`, `domain`, `verifier_kwargs`, `response`, `chosen`, `rejected` (docs/data.md)."""
    verifier: str | None = None
    """Verifier of rows that name none (`math`, `code`, `ifeval`, `judge`, `rubric`, a
    registered name or `module:function`)."""
    answer_transform: str | None = None
    """Applied to each row's ground truth after the mapping: `gsm8k` (the text after GSM8K's
    `#### `, commas dropped) or `module:function` (a function of the ground truth returning
    the new one; a ValueError skips the row)."""


@dataclass(frozen=True)
class DataConfig:
    sources: list[SourceConfig] = field(default_factory=list)
    """Prompt sources with mixture weights."""
    eval_sources: list[SourceConfig] = field(default_factory=list)
    """Held-out prompt sources for `eval`."""
    prompt_template: Literal["chat", "r1", "plain"] = "plain"
    """How a row's prompt becomes text: the tokenizer's chat template, the R1
    `<think>/<answer>` template, or the raw text."""
    max_prompt_len: int = 256
    """Prompts longer than this (tokens) are skipped and counted."""
    seed: int = 0
    """Seed of the mixture sampler and shuffling."""


@dataclass(frozen=True)
class InterruptConfig:
    thinking_budget: int = 0
    """Budget forcing (ScaleRL's interruptions): a completion that has generated this many
    tokens without stopping gets `text` appended by the engine (its KV cache continues) and
    may then answer; 0 = off."""
    text: str = "</think> Okay, time to answer."
    """The inserted string (tokenized without special tokens). Its tokens are part of the
    completion (reward, samples log) but not sampled: masked out of the loss and of the
    log-prob / TIS statistics."""
    answer_budget: int = 32
    """Tokens the completion may generate after the inserted text; thinking_budget + the
    text's tokens + this must fit in `rollout.max_new_tokens`."""


@dataclass(frozen=True)
class RolloutConfig:
    mode: Literal["sync", "async"] = "sync"
    """`sync`: generate, score, train, repeat. `async`: the actors generate while the
    learner trains, with in-flight weight updates."""
    backend: Literal["jetstream", "vllm"] = "jetstream"
    """Rollout engine: our JAX engine (JetStream `Engine` API) or vLLM's engine (its GPU
    build, or its CPU build in its own venv: docs/vllm.md). What each honours:
    `rlvr_jax.rollout.api.BACKENDS`."""
    num_samples: int = 8
    """G: completions per prompt (group size)."""
    max_new_tokens: int = 64
    """Generation budget per completion (T_max of Dr.GRPO's normaliser)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 = off, as RLVR requires for exact log-probs)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    max_slots: int = 32
    """Decode slots of the continuous-batching engine."""
    max_staleness: int = 1
    """Async: a sample generated by policy version v trains step s only if s - v <= this
    (v: the oldest version that produced a token of its group). Dropped groups were decoded in
    full; below `queue_size` many are (a run warns past 20%)."""
    queue_size: int = 4
    """Async: batches of requests the actors keep in flight (generated ahead of the learner)."""
    stop_strings: list[str] = field(default_factory=list)
    """Extra stop strings (converted to token ids); the EOS token always stops."""
    decode_chunk: int = 8
    """Decode steps per jitted call (host polls between chunks)."""
    kv_layout: Literal["paged", "contiguous"] = "paged"
    """KV cache: `paged` (a pool of pages; decode reads only the pages in use, slots are
    not tied to `max_slots × max_len` of memory) or `contiguous` (a fixed row of the full
    length per slot; the baseline)."""
    page_size: int = 16
    """Tokens per KV page (paged)."""
    kv_pages: int | None = None
    """KV pool size in pages, all actor devices together (paged; set this or
    `kv_cache_gib`; neither = the memory `max_slots` contiguous rows would take)."""
    kv_cache_gib: float | None = None
    """KV pool size in GiB per actor device (paged; set this or `kv_pages`)."""
    prefill_chunk: int = 512
    """Prompt tokens prefilled per chunk, interleaved with decode chunks (paged; a contiguous
    engine writes a prompt whole at admission)."""
    on_push: Literal["keep", "recompute"] = "keep"
    """What in-flight sequences do at a weight push: `keep` their KV cache, computed by the
    older weights, and continue on the new ones (PipelineRL: nothing recomputed; a
    completion's tokens carry the version that sampled each); `recompute` drop it and prefill
    prompt and tokens so far again with the new weights (the preemption path), so every token
    sampled after the push attends to K/V of the weights that sample it — costs a prefill of
    every in-flight sequence per push (`rollout/recomputed_tokens`). Both backends offer both
    (`rlvr_jax.rollout.api.BACKENDS`)."""
    compile_ahead: bool = True
    """Compile every program of our engine (each prefill chunk and decode row bucket) when the
    rollout is built, so that no request stalls to compile one; off, each compiles on first
    use, and a short run pays only for what it meets (`rlvr-serve` always does: it starts
    sooner). vLLM compiles its own."""
    push_timeout_s: float = 600.0
    """A weight push to the actors (hand-over, swap and probe) still running after this many
    seconds stops the run with `PushTimeoutError` instead of hanging; 0 = no limit."""
    push_probe_tokens: int = 4
    """After each push, the actors sample this many tokens of a fixed prompt on the new
    weights and the learner re-scores them (`push/probe_max_abs_logp`); 0 = no probe."""
    push_probe_tolerance: float = 1.0
    """The probe's largest |actor − learner| log-prob above which the run stops with
    `StaleWeightsError` (the actors do not hold the pushed weights). The on-policy mismatch is
    ~1e-6 in float32 and up to ~0.07 in bfloat16; tighten it to catch smaller updates."""
    weight_dtype: Literal["float32", "bfloat16", "int8", "fp8"] | None = None
    """Storage of the actors' decode matmul weights; None = `model.compute_dtype` (as the
    learner). `int8` / `fp8` (float8_e4m3fn): quantized per output channel (via qwix), the
    matmuls in the compute dtype. The learner keeps full precision: the sampler/learner gap
    this opens shows in `kl/sampler_learner` and `tis/*`, and TIS (`loss.tis_cap`) corrects
    it. Embedding, norms and the fp32 LM head are unchanged."""
    interrupt: InterruptConfig = field(default_factory=InterruptConfig)
    """Budget forcing (`rlvr_jax.rollout.api.Interrupt`; our engine only, not vLLM); metric
    `rollout/interrupted_fraction`."""
    exact: bool = False
    """Sampler and learner compute the same function: the engine decodes every slot every
    step (a slot's arithmetic then does not depend on the others), and the learner's old
    log-probs (TIS, `mismatch/*`) are the completions replayed through the engine's own decode
    step with the learner's params (`rlvr_jax.rollout.rescore`): equal to the sampler's bit for
    bit on policy. Costs a second pass over the rollouts per step (docs/trainer.md)."""


@dataclass(frozen=True)
class EnvConfig:
    name: str | None = None
    """Multi-turn environment (`rlvr_jax.envs`): `tools` (`ToolEnv`: the model may call
    `env.tools`), `gym` (a gymnasium-style text environment), a registered name or
    `module:function`; None = one turn per completion. Its turns run inside the engine's
    slots; `rollout.max_new_tokens` is each episode's budget (generated and appended tokens);
    prompts are rendered by the environment through the chat template (`data.prompt_template`
    is not used) and must fit `data.max_prompt_len`."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's factory (`tools`: `system`,
    `max_output_chars`; `gym`: `id` or `entry_point`, `make_kwargs`)."""
    tools: list[str] = field(default_factory=lambda: ["python", "calculator"])
    """`env.name: tools`: the tools offered, built-in (`python`: runs in the code sandbox;
    `calculator`: exact arithmetic) or `module:function` (a typed Python function: its JSON
    schema comes from its signature and docstring)."""
    max_turns: int = 4
    """Assistant turns per episode; an episode still calling tools then is truncated."""
    tool_timeout_s: float = 10.0
    """`env.name: tools`: bound of each tool call (an error message to the model past it)."""
    workers: int = 4
    """Threads running the environments' turns (tools included), off the engine's thread."""


def _preset_or(default: Any) -> Any:
    """A `loss.*` key that may be left unset (None): it then takes the preset's value, else
    `default` (`rlvr_jax.losses.LossSettings` resolves them)."""
    return field(default=None, metadata={"unset": default})


@dataclass(frozen=True)
class LossConfig:
    preset: str | None = None
    """Named bundle of the settings below (`olmo3`, `grpo`, `dapo`, `drgrpo`, `cispo`,
    `gspo`, `ppo`); explicit keys override it."""
    variant: str | None = _preset_or("ppo_clip")
    """Policy loss: registered name or `module:function`."""
    advantage: str | None = _preset_or("grpo")
    """Advantage estimator: registered name or `module:function`; `gae` = PPO with a learned
    critic (per-token GAE advantages, see `critic`)."""
    eps_low: float | None = None
    """Lower clip range; None = the variant's default; ignored by a variant without one."""
    eps_high: float | None = None
    """Upper clip range (clip-higher); None = the variant's default; ignored by a variant
    without one (reinforce)."""
    agg: str | None = _preset_or("token-mean")
    """Aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum |
    seq-mean-token-sum-norm."""
    tis_cap: float | None = None
    """Truncated importance sampling cap C (None = off)."""
    tis_mode: str | None = _preset_or("token")
    """TIS weight: `token`, `sequence`, `geometric`, or `mask` (drop outside [low, high])."""
    tis_low: float | None = None
    """TIS `mask` mode: drop tokens whose exp(old_logp − sampler_logp) is below this."""
    tis_high: float | None = None
    """TIS `mask` mode: drop tokens whose exp(old_logp − sampler_logp) is above this (IcePop: 5)."""
    kl_coef: float | None = _preset_or(0.0)
    """β of the KL term against the frozen reference (0 = no reference policy)."""
    kl_estimator: str | None = _preset_or("k3")
    """k1 | k2 | k3."""
    kl_mode: Literal["loss", "reward"] | None = _preset_or("loss")
    """Add β·KL to the loss, or subtract it from the reward."""
    ratio_denominator: Literal["old", "sampler"] | None = _preset_or("old")
    """Ratio denominator: recomputed `old` log-probs, or the `sampler`'s (saves a forward)."""
    variant_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the variant (e.g. `dual_clip: 3.0`)."""


@dataclass(frozen=True)
class CriticConfig:
    kind: Literal["separate", "shared"] = "separate"
    """The value model of `loss.advantage: gae`: `separate` (its own trunk, from `path`, with a
    scalar head) or `shared` (a scalar head on the policy's trunk; the value loss then also
    trains the trunk, weighted by `value_coef`)."""
    path: str | None = None
    """A local HF checkpoint for the separate critic's trunk (same tokenizer as the policy;
    may be smaller); None = the policy's starting checkpoint."""
    learning_rate: float | None = None
    """Peak learning rate of the critic's AdamW (same schedule, warmup and clipping as the
    policy's); None = `train.learning_rate`."""
    value_coef: float = 0.5
    """c_V: the loss minimised is policy loss + c_V · value loss."""
    value_clip: float | None = 0.2
    """ε_V of the clipped value loss (values kept within ±ε_V of the rollout-time values);
    None or 0 = unclipped."""
    gamma: float = 1.0
    """GAE discount γ."""
    lam: float = 0.95
    """GAE λ (1 = Monte-Carlo returns minus V, 0 = one-step TD)."""
    whiten_advantages: bool = True
    """Normalise the GAE advantages to mean 0, std 1 over the batch's completion tokens."""


@dataclass(frozen=True)
class FilterConfig:
    zero_variance: bool = True
    """Drop groups whose rewards are all equal."""
    active_sampling: bool = True
    """Keep drawing groups until the batch holds `train.prompts_per_batch` kept groups."""
    max_draws: int = 4
    """Cap on draws per batch, in multiples of `train.prompts_per_batch`."""
    overlong_filter: bool = False
    """Mask completions cut off by the length limit (DAPO)."""
    soft_overlong_buffer: int = 0
    """L_c of DAPO's soft overlong punishment (0 = off)."""


@dataclass(frozen=True)
class RewardsConfig:
    domain_weights: dict[str, float] = field(default_factory=dict)
    """Per-domain multiplier on the verifier reward (default 1.0)."""
    format_weight: float = 0.0
    """Weight of the `<think>/<answer>` format reward term."""
    workers: int = 0
    """Reward worker pool size; 0 = one per CPU core."""
    timeout_s: float = 5.0
    """Hard timeout per verification."""
    code_mode: Literal["fraction", "all"] = "fraction"
    """Code reward: fraction of tests passed, or 1 only if all pass."""
    ifeval_mode: Literal["all", "fraction"] = "all"
    """Instruction reward: 1 only if all constraints hold, or the fraction."""
    judge_url: str | None = None
    """OpenAI-compatible endpoint of the LLM judge."""
    judge_model: str | None = None
    """Judge model name sent to the endpoint."""
    judge_api_key_env: str = "RLVR_JUDGE_API_KEY"
    """Environment variable holding the judge's API key (never logged)."""
    rubric_url: str = "http://127.0.0.1:8000/v1"
    """OpenAI-compatible endpoint scoring `rubric` criteria (default: `rlvr-serve` here); its
    API key comes from `judge_api_key_env`."""
    rubric_model: str | None = None
    """Model name sent to the rubric judge (None = the first model its `/models` lists)."""
    rubric_timeout_s: float = 30.0
    """Bound on each rubric judge request attempt (connecting and each wait for the server)."""
    rubric_max_concurrency: int = 16
    """Rubric judge requests in flight at once."""
    rubric_cache_size: int = 100_000
    """Criterion scores cached by (prompt, response, criterion); 0 = no cache."""


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = 10
    """Optimizer steps to run."""
    output_dir: str = "runs/default"
    """Metrics, checkpoints, plots and the exported policy go here."""
    prompts_per_batch: int = 4
    """Groups (prompts) per rollout batch."""
    updates_per_batch: int = 1
    """Optimizer steps (mini-batches) per rollout batch."""
    micro_batch_size: int = 0
    """Rows per gradient-accumulation micro-batch (0 = the whole mini-batch)."""
    learning_rate: float = 1e-6
    """Peak learning rate."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after warmup."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_b1: float = 0.9
    """AdamW β1."""
    adam_b2: float = 0.999
    """AdamW β2."""
    adam_eps: float = 1e-8
    """AdamW ε."""
    max_grad_norm: float = 1.0
    """Global-norm gradient clipping (0 = off)."""
    save_batch: str | None = None
    """Write one training batch to this .npz (for `rlvr-bench losses --batch`)."""
    remat: bool = False
    """Rematerialise each layer in the backward pass (activation memory ~ one layer)."""
    attn_chunk: int = 0
    """Deprecated (use `model.attention_impl`): with `xla` attention, queries per chunk
    (N·chunk·S scores live at once instead of N·S²); with `blockwise`, its tile size
    (0 = 512, or 256 on shared-prompt rows); cudnn/splash ignore it."""
    logits_chunk: int = 0
    """LM head + log-softmax computed this many positions at a time (0 = all): never holds the
    B×T×V fp32 logits at once."""
    max_tokens_per_micro_batch: int = 0
    """Pack sequences (prompt + completion) several to a row and size micro-batches by tokens:
    rows of the batch's length bucket, as many per micro-batch as this many tokens allow, the
    number of micro-batches following the batch's tokens (a few compiled shapes). 0 = one
    sequence per row, `micro_batch_size` rows per micro-batch. `sft` and `expert_iteration`
    pack their examples the same way; `rl_sft_parallel` packs its RL half (its SFT rows stay
    one per row). `--dry-run` plans one micro-batch as the full-length rows this holds."""
    share_prompts: bool = True
    """Lay out each group's prompt once in the learner's rows, followed by its G completions
    (each sees the prompt and itself, at its own positions): the same log-probs, losses and
    gradients as one completion per row, the prompt's forward and backward done once instead
    of G times (RL, PPO, the RL half of rl_sft_parallel). Applies where the attention kernel
    is blockwise or xla anyway (CPU, or chosen; not where cuDNN or splash would run), for
    models without sliding-window layers, and when mini- and micro-batches hold whole groups;
    elsewhere, and with false, one completion per row."""
    bucket_min_len: int = 32
    """Learner rows are padded to the batch's longest prompt + completion rounded up to
    bucket_min_len·2^k (a multiple of the chunk sizes; at most max_prompt_len +
    max_new_tokens): short batches cost less, with at most log2(full / bucket_min_len) + 2
    compiles. 0 = always the full length (one compile)."""
    compilation_cache_dir: str | None = "~/.cache/rlvr_jax/xla"
    """JAX's persistent compilation cache: programs compiled once (a batch shape, the engine's
    steps) load from here in later runs and in the next trainer of the same process (a resumed
    run, `rlvr-bench e2e`'s rounds). null = off. `JAX_COMPILATION_CACHE_DIR`, when set, wins."""
    compile_ahead: bool = True
    """Compile every packed-row count the learner's batches may take (shared-prompt groups
    packed several to a row) with the first batch, so that no later step stalls to compile one.
    A short run pays for counts it never meets (the demo's 30 steps from a cold cache: 134 s
    with, 121 s without; `configs/demo.yaml` turns it off, `rlvr-bench e2e` on)."""


@dataclass(frozen=True)
class SFTConfig:
    sources: list[SourceConfig] = field(default_factory=list)
    """SFT examples: prompt rows that also carry a response (default: `data.sources`)."""
    response_field: str = "response"
    """Row field holding the target response of an SFT example."""
    synthetic_reference: bool = False
    """Rows without a response use `rlvr_jax.data.synthetic.reference_response(row)` (the
    demo's synthetic tasks have exact reference solutions)."""
    batch_size: int = 32
    """Examples per SFT optimizer step."""
    learning_rate: float | None = None
    """η_SFT of `rl_sft_parallel`'s SFT optimizer (None = `train.learning_rate`)."""
    expert_min_score: float = 1.0
    """Expert iteration keeps samples whose verifier score is at least this."""
    expert_sft_steps: int = 1
    """SFT optimizer steps per expert-iteration round."""


@dataclass(frozen=True)
class DPOConfig:
    sources: list[SourceConfig] = field(default_factory=list)
    """Preference pairs: rows with `prompt`, `chosen`, `rejected` (strings or chat messages;
    `rlvr-prefs` writes them). Pairs with a prompt over `data.max_prompt_len` or a response over
    `dpo.max_response_len` tokens are skipped and counted."""
    batch_size: int = 32
    """Pairs per optimizer step (two sequences each: `train.micro_batch_size` counts
    sequences and must be even)."""
    beta: float = 0.1
    """β: the inverse temperature of the implicit reward β·log(π/π_ref) (OLMo 3 Think's
    length-normalised DPO used 5)."""
    variant: str = "dpo"
    """Preference loss: `dpo`, `ipo`, `dpo_norm` (length-normalised), `simpo`
    (reference-free), or `module:function`."""
    variant_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the variant (`label_smoothing` for dpo, `gamma` for simpo)."""
    reference: Literal["cache", "on_the_fly"] = "cache"
    """Reference log-probs of the frozen starting policy: computed once before training and
    cached on disk (no reference forward per step), or computed for every batch."""
    max_response_len: int | None = None
    """Longest response in tokens (separator and EOS included); None = `rollout.max_new_tokens`
    (the generation budget: re-tokenized sampled text can come out a little longer)."""
    reference_cache_dir: str | None = None
    """Directory of the reference cache (one file per model, keyed by the tokens);
    None = `<train.output_dir>/reference_cache`."""


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 0
    """Save every N steps (0 = only at the end)."""
    keep: int = 2
    """Checkpoints kept (keep-last-N)."""
    resume: bool = True
    """Resume from the latest complete checkpoint in `train.output_dir`."""
    export_hf: bool = True
    """Export the final policy as an HF checkpoint."""
    verify: Literal["checksum", "size", "off"] = "checksum"
    """File check of each checkpoint: a manifest of every file's size and CRC-32 is written
    after the save (in the background) and checked before a resume, naming a damaged file;
    `size`: sizes only (catches cut-short files, reads nothing); `off`: no manifest."""


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 0
    """Held-out evaluation every N steps (0 = off)."""
    num_samples: int = 8
    """Samples per prompt (n of the pass@k estimator)."""
    ks: list[int] = field(default_factory=lambda: [1, 8])
    """k values of pass@k."""
    max_prompts: int = 64
    """Held-out prompts per evaluation."""
    temperature: float = 1.0
    """Sampling temperature for evaluation."""
    seed: int = 12345
    """Sampling seed of the held-out evaluation (prompt i samples with
    `rollout.request_seed(seed, i)`); `rlvr-eval --seed` with the same value samples the same."""


@dataclass(frozen=True)
class LogConfig:
    tensorboard: bool = True
    """Also write TensorBoard event files."""
    progress_bar: bool = True
    """Show a progress bar on the console."""
    sample_completions: int = 2
    """Completions logged as text per step."""
    plots: bool = True
    """PNG plots of the main curves at the end."""
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    """Level of the libraries' own logs (absl, orbax, JAX, JetStream, TensorFlow): "warning"
    keeps their INFO lines off; rlvr_jax's one-line messages always show. `--verbose` = "info"."""


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy (and its tokenizer)."""
    algorithm: Literal["rl", "sft", "expert_iteration", "rl_sft_parallel", "dpo"] = "rl"
    """Training algorithm."""
    seed: int = 0
    """Global seed (params init when built, sampling, data order)."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Device mesh and its learner/actor split."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompt sources."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The rollout engine."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Multi-turn environments and tools (off by default)."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy loss, advantages, KL, TIS."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The learned value model of PPO (`loss.advantage: gae`)."""
    filter: FilterConfig = field(default_factory=FilterConfig)
    """Group filtering and active sampling."""
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    """Verifiers and reward weights."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimizer and loop."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning data and settings (sft, expert_iteration, rl_sft_parallel)."""
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """Preference pairs and the preference loss (`algorithm: dpo`)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing and export."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""
    log: LogConfig = field(default_factory=LogConfig)
    """Metrics and console output."""
