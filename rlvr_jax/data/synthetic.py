"""The synthetic verifiable task family of the embedded demo: seeded, with disjoint train and
held-out splits, over two domains with different verifiers.

- `arithmetic`: multi-step integer arithmetic answered in `\\boxed{}` (verifier `math`,
  ground truth the answer string); difficulty from `ArithmeticSpec`.
- `ifeval`: a short writing task with IFEval constraints (verifier `ifeval`, ground truth
  `{"instruction_id": [...], "kwargs": [...]}`); knobs in `IfevalSpec`.

Splits are disjoint by construction: the hash of a problem's canonical key alone decides its
split (`test_fraction` of the key space is `test`), and no problem repeats within one. Rows
carry a domain field (`expression`, `topic`) for `reference_response`; `generate(split, n)`
is a prefix of `generate(split, n + k)`.

    python -m rlvr_jax.data.synthetic --out data/synthetic --train 2000 --test 200
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from rlvr_jax.data import tasks_arithmetic, tasks_ifeval
from rlvr_jax.data.rng import stream
from rlvr_jax.data.tasks_arithmetic import ArithmeticSpec
from rlvr_jax.data.tasks_ifeval import IfevalSpec

DOMAINS = ("arithmetic", "ifeval")
"""The synthetic domains."""

SPLITS = ("train", "test")
"""The splits; `test` is the held-out one."""

DEFAULT_ARITHMETIC = ArithmeticSpec()
"""Arithmetic difficulty when none is given (1-3 operations on operands up to 20)."""

DEFAULT_IFEVAL = IfevalSpec()
"""Constraint-domain knobs when none are given (1-2 constraints from all ids)."""

MAX_REJECTIONS = 10_000
"""Consecutive rejected candidates (duplicates, other split) before the space counts as
exhausted and `generate` raises."""


def split_of(domain: str, key: str, test_fraction: float) -> str:
    """The split a problem belongs to, from a hash of (domain, canonical key)."""
    digest = hashlib.blake2b(f"{domain}\x1f{key}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "little") / 2.0**64
    return "test" if u < test_fraction else "train"


def generate(
    split: str,
    n: int,
    seed: int = 0,
    domains: Sequence[str] | Mapping[str, float] = DOMAINS,
    *,
    arithmetic: ArithmeticSpec = DEFAULT_ARITHMETIC,
    ifeval: IfevalSpec = DEFAULT_IFEVAL,
    test_fraction: float = 0.125,
) -> list[dict]:
    """`n` distinct rows of `split` ("train" or "test"), deterministic; `domains` mixed equally
    (a sequence) or by weight (a mapping). ValueError for an unknown split or domain, or a
    problem space too small for `n` rows (level-1 arithmetic has 300)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    names, probs = _domain_probs(domains)
    makers = {
        "arithmetic": lambda rng: tasks_arithmetic.make_problem(rng, arithmetic),
        "ifeval": lambda rng: tasks_ifeval.make_problem(rng, ifeval),
    }
    rng = stream(seed, "synthetic", split)
    rows: list[dict] = []
    seen: set[tuple[str, str]] = set()
    rejected = 0
    while len(rows) < n:
        domain = names[int(rng.choice(len(names), p=probs))]
        key, row = makers[domain](rng)
        if (domain, key) in seen or split_of(domain, key, test_fraction) != split:
            rejected += 1
            if rejected > MAX_REJECTIONS:
                raise ValueError(
                    f"synthetic {split!r}: {MAX_REJECTIONS} candidates in a row were duplicates "
                    f"or belonged to the other split after {len(rows)} rows; the {domain!r} "
                    f"problem space is too small for n={n} (make it harder or ask for fewer)"
                )
            continue
        rejected = 0
        seen.add((domain, key))
        rows.append(row)
    return rows


def _domain_probs(domains: Sequence[str] | Mapping[str, float]) -> tuple[list[str], np.ndarray]:
    weights = dict(domains) if isinstance(domains, Mapping) else dict.fromkeys(domains, 1.0)
    unknown = [d for d in weights if d not in DOMAINS]
    if unknown or not weights:
        raise ValueError(
            f"unknown or no synthetic domains {unknown or list(weights)}; known: {DOMAINS}"
        )
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"domain weights must be >= 0 with a positive sum, got {weights}")
    names = list(weights)
    probs = np.array([weights[d] for d in names], dtype=np.float64)
    return names, probs / probs.sum()


def reference_response(row: Mapping) -> str:
    """A correct response to a synthetic row (worked arithmetic, or a text meeting every
    constraint): a demonstration for SFT warm-up, and a check that ground truths are right."""
    responder = REFERENCE_RESPONSES.get(row.get("domain"))
    if responder is None:
        raise ValueError(f"not a synthetic row (domain {row.get('domain')!r})")
    return responder(dict(row))


REFERENCE_RESPONSES = {
    "arithmetic": tasks_arithmetic.reference_response,
    "ifeval": tasks_ifeval.reference_response,
}
"""Reference-response writers by synthetic domain."""


def write_lines(lines: Iterable[str], path: str | Path) -> Path:
    """Writes one line per entry to `path`, atomically (a temp file, then a rename)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
    tmp.replace(out)
    return out


def write_jsonl(rows: Iterable[Mapping], path: str | Path) -> Path:
    """Writes `rows` as UTF-8 JSON lines to `path` (atomically: a temp file, then a rename)."""
    return write_lines((json.dumps(row, ensure_ascii=False) for row in rows), path)


def splits_parser(module: str, doc: str | None, *, test: int) -> argparse.ArgumentParser:
    """The command line of `python -m <module>` writing train/test splits: `--out DIR`,
    `--train N` (2000), `--test N`, `--seed`."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--train", type=int, default=2000, help="training rows")
    parser.add_argument("--test", type=int, default=test, help="held-out rows")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Writes `train.jsonl` and `test.jsonl` of the synthetic family under `--out`."""
    parser = splits_parser("rlvr_jax.data.synthetic", __doc__, test=200)
    parser.add_argument("--domains", default=",".join(DOMAINS), help="comma-separated")
    parser.add_argument("--level", type=int, default=2, help="arithmetic difficulty 1..5")
    args = parser.parse_args(argv)
    spec = ArithmeticSpec.for_level(args.level)
    domains = [d for d in args.domains.split(",") if d]
    for split, n in (("train", args.train), ("test", args.test)):
        rows = generate(split, n, args.seed, domains, arithmetic=spec)
        path = write_jsonl(rows, Path(args.out) / f"{split}.jsonl")
        print(f"wrote {len(rows)} rows to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
