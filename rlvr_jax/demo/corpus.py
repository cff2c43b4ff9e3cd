"""The demo's task family and the pretraining corpus of its tiny base model.

The tasks are `rlvr_jax.data.synthetic` cut to what a few-million-parameter model learns on a
CPU in minutes (prompts ≤ ~70 tokens, answers ≤ ~60): single-digit arithmetic with one or two
operators (`math`), and one IFEval constraint a response can fail per writing task (`ifeval`).
The corpus answers each training problem in one of several styles, so the base model puts real
but not dominant probability on a correct answer (where RL helps, §3.4 of the
RL-during-pretraining paper):

- arithmetic `worked`: the reference steps and `\\boxed{}` answer (correct);
  `slipped`: the same steps with one result off by a small amount, carried to the end (wrong);
  `direct`: only the final answer, correct in the text — but without the steps a small model
  mostly cannot compute it, so on new problems this style is usually wrong.
- ifeval `follow`: the reference response (meets the constraint); `ignore`: the response to
  the task without its constraint; `misread`: the response to the constraint with other
  arguments (another end phrase, keyword, bullet count or postscript marker).

Splits for the trainer come from `write_splits` (held-out problems disjoint by construction):

    python -m rlvr_jax.demo.corpus --out data/demo --train 2000 --test 256
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_jax.data import synthetic
from rlvr_jax.data.formatting import encode_response, format_prompt
from rlvr_jax.data.rng import stream
from rlvr_jax.data.rows import row_from_record
from rlvr_jax.data.tasks_arithmetic import ArithmeticSpec, Node, apply_op, evaluate, fold, parse
from rlvr_jax.data.tasks_ifeval import CONSTRAINTS, IfevalSpec
from rlvr_jax.training.sft import collate_sft, pack_examples

DEMO_ARITHMETIC = ArithmeticSpec(min_ops=1, max_ops=2, max_operand=9)
"""Arithmetic of the demo: `a op b` or `a op b op c` with operands 0..9 and ops `+ - *`."""

DEMO_INSTRUCTIONS = (
    "change_case:english_lowercase",
    "detectable_format:title",
    "startend:end_checker",
    "keywords:existence",
    "startend:quotation",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
)
"""IFEval ids of the demo: each changes what a response must look like (`punctuation:no_comma`,
`keywords:forbidden_words` and `length_constraints:number_words` are left out: almost any short
response meets them, or the reference response is longer than the demo's answer budget)."""

DEMO_IFEVAL = IfevalSpec(min_constraints=1, max_constraints=1, instruction_ids=DEMO_INSTRUCTIONS)
"""One constraint per prompt (two make prompts longer than ~64 tokens)."""

DEMO_DOMAINS: Mapping[str, float] = {"arithmetic": 0.5, "ifeval": 0.5}
"""Mixture of the demo's two domains (verifiers `math` and `ifeval`)."""

ARITHMETIC_STYLES = ("worked", "slipped", "direct")
IFEVAL_STYLES = ("follow", "ignore", "misread")
STYLES = {"arithmetic": ARITHMETIC_STYLES, "ifeval": IFEVAL_STYLES}
"""The answer styles of each demo domain (fields of `StyleMix`)."""


@dataclass(frozen=True)
class StyleMix:
    """How often the corpus answers in each style (weights per domain, normalised)."""

    worked: float = 0.3
    """Arithmetic: correct steps and answer."""
    slipped: float = 0.2
    """Arithmetic: steps with one wrong result carried to a wrong answer."""
    direct: float = 0.5
    """Arithmetic: the correct answer with no steps."""
    follow: float = 0.3
    """IFEval: a response meeting the constraint."""
    ignore: float = 0.4
    """IFEval: the response without the constraint."""
    misread: float = 0.3
    """IFEval: the response to the constraint with other arguments."""
    max_slip: int = 3
    """A slipped step's result is off by 1..max_slip (either sign)."""

    def __post_init__(self) -> None:
        weights = dataclasses.asdict(self)
        for domain, styles in STYLES.items():
            chosen = {s: weights[s] for s in styles}
            if min(chosen.values()) < 0 or sum(chosen.values()) <= 0:
                raise ValueError(
                    f"StyleMix: {domain} weights {chosen} must be >= 0 with a positive sum"
                )
        if self.max_slip < 1:
            raise ValueError(f"StyleMix.max_slip must be >= 1, got {self.max_slip}")

    def probabilities(self, domain: str) -> tuple[tuple[str, ...], np.ndarray]:
        """(styles, their probabilities) of `domain`."""
        if domain not in STYLES:
            raise ValueError(f"StyleMix: no styles for domain {domain!r}")
        weights = dataclasses.asdict(self)
        probs = np.array([weights[s] for s in STYLES[domain]], np.float64)
        return STYLES[domain], probs / probs.sum()


def demo_rows(split: str, n: int, seed: int) -> list[dict]:
    """`n` rows of the demo task family (`split`: "train" or "test")."""
    return synthetic.generate(
        split, n, seed, DEMO_DOMAINS, arithmetic=DEMO_ARITHMETIC, ifeval=DEMO_IFEVAL
    )


def worked_lines(tree: Node, slip_step: int | None = None, slip: int = 0) -> tuple[list[str], int]:
    """The `a op b = c` steps of `tree`, innermost first, and the final value; with
    `slip_step`, that step's result is off by `slip` and later steps use the wrong value."""
    lines: list[str] = []

    def step(op: str, a: int, b: int) -> int:
        c = apply_op(op, a, b)
        if len(lines) == slip_step:
            c += slip
        lines.append(f"{a} {op} {b} = {c}")
        return c

    value = fold(tree, step)
    return lines, value


def _boxed(value: int) -> str:
    return f"The answer is \\boxed{{{value}}}."


def arithmetic_response(
    row: Mapping[str, Any], style: str, rng: np.random.Generator, mix: StyleMix
) -> str:
    """The answer to an arithmetic row in `style` (`worked`, `slipped` or `direct`)."""
    tree = parse(row["expression"])
    if style == "direct":
        return _boxed(evaluate(tree))
    if style == "worked":
        return synthetic.reference_response(row)
    if style != "slipped":
        raise ValueError(f"unknown arithmetic style {style!r}; expected one of {ARITHMETIC_STYLES}")
    n_steps = len(worked_lines(tree)[0])
    slip = int(rng.integers(1, mix.max_slip + 1)) * (1 if rng.random() < 0.5 else -1)
    lines, value = worked_lines(tree, int(rng.integers(0, n_steps)), slip)
    return "\n".join([*lines, _boxed(value)])


def _with_ground_truth(row: Mapping[str, Any], ids: list[str], kwargs: list[dict]) -> dict:
    return {**row, "ground_truth": {"instruction_id": ids, "kwargs": kwargs}}


def ifeval_response(row: Mapping[str, Any], style: str, rng: np.random.Generator) -> str:
    """The answer to an ifeval row in `style` (`follow`, `ignore` or `misread`)."""
    ids = list(row["ground_truth"]["instruction_id"])
    kwargs = [dict(kw) for kw in row["ground_truth"]["kwargs"]]
    if style == "follow":
        return synthetic.reference_response(row)
    if style == "ignore":
        return synthetic.reference_response(_with_ground_truth(row, [], []))
    if style != "misread":
        raise ValueError(f"unknown ifeval style {style!r}; expected one of {IFEVAL_STYLES}")
    i = int(rng.integers(0, len(ids)))
    if not kwargs[i]:  # a constraint without arguments has nothing to misread: ignore it
        return synthetic.reference_response(_with_ground_truth(row, [], []))
    other = kwargs[i]
    while other == kwargs[i]:  # every argumented constraint has >= 2 argument values
        other = CONSTRAINTS[ids[i]].sample(rng)
    kwargs[i] = other
    return synthetic.reference_response(_with_ground_truth(row, ids, kwargs))


def styled_response(
    row: Mapping[str, Any], rng: np.random.Generator, mix: StyleMix
) -> tuple[str, str]:
    """(style, response text) for one demo row, the style drawn from `mix`."""
    domain = row.get("domain")
    styles, probs = mix.probabilities(domain)
    style = styles[int(rng.choice(len(styles), p=probs))]
    if domain == "arithmetic":
        return style, arithmetic_response(row, style, rng, mix)
    return style, ifeval_response(row, style, rng)


def encode_prompt(row: Mapping[str, Any], tokenizer: Any, template: str) -> list[int]:
    """The prompt ids of a demo row under `template` (what the trainer prompts with)."""
    record = row_from_record(row, source="demo", index=0, where="demo corpus row")
    return format_prompt(record, tokenizer, template)


def styled_examples(
    rows: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    template: str,
    mix: StyleMix,
    seed: int,
) -> Iterator[tuple[list[int], list[int]]]:
    """Endless (prompt ids, response ids) of the corpus: epochs over `rows` in a fresh order,
    each row answered in a style drawn anew from `mix`."""
    if not rows:
        raise ValueError("styled_examples: no rows")
    prompts = [encode_prompt(row, tokenizer, template) for row in rows]
    for epoch in itertools.count():
        rng = stream(seed, "demo-corpus", epoch)
        for i in rng.permutation(len(rows)):
            _, response = styled_response(rows[i], rng, mix)
            yield prompts[i], encode_response(response, tokenizer, template)


def packed_batches(
    examples: Iterator[tuple[list[int], list[int]]],
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    loss_on_prompt: bool,
) -> Iterator[dict[str, np.ndarray]]:
    """SFT batches of `rows` rows of `seq_len` tokens packed with consecutive examples; with
    `loss_on_prompt` every token but an example's first is trained on (pretraining)."""
    buffer: list[tuple[list[int], list[int]]] = []
    for prompt, response in examples:
        if len(prompt) + len(response) > seq_len:
            raise ValueError(
                f"a corpus document has {len(prompt) + len(response)} tokens > seq_len "
                f"{seq_len} (raise the row length, or the vocabulary for shorter encodings)"
            )
        if loss_on_prompt:
            prompt, response = prompt[:1], [*prompt[1:], *response]
        buffer.append((prompt, response))
        lengths = [len(p) + len(r) for p, r in buffer]
        if len(pack_examples(lengths, rows=rows, seq_len=seq_len)) == len(buffer):
            continue
        full, buffer = buffer[:-1], buffer[-1:]
        yield collate_sft(
            [p for p, _ in full],
            [r for _, r in full],
            rows=rows,
            seq_len=seq_len,
            pad_id=pad_id,
            pack=True,
        )


def write_splits(out_dir: str | Path, *, train: int, test: int, seed: int = 0) -> list[Path]:
    """Writes `train.jsonl` and `test.jsonl` (the held-out split) of the demo tasks."""
    out = Path(out_dir)
    return [
        synthetic.write_jsonl(demo_rows(split, n, seed), out / f"{split}.jsonl")
        for split, n in (("train", train), ("test", test))
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m rlvr_jax.demo.corpus --out data/demo`: writes the demo's JSONL splits."""
    args = synthetic.splits_parser("rlvr_jax.demo.corpus", __doc__, test=256).parse_args(argv)
    for path in write_splits(args.out, train=args.train, test=args.test, seed=args.seed):
        n = sum(1 for _ in path.open(encoding="utf-8"))
        print(json.dumps({"path": str(path), "rows": n, "bytes": path.stat().st_size}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
