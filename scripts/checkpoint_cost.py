"""What the checkpoint file check costs here, per GB: an orbax save of a random float32 state
of `--gb` GB, then the manifest (CRC-32 of every file), a checksum verification and a
size-only verification of the same checkpoint.

usage: python scripts/checkpoint_cost.py [--gb 1.0] [--dir /tmp/ckpt_cost]

The files are still in the page cache when they are hashed, which is also the case for the
manifest written right after a save; a verification at resume after a reboot reads from disk
and runs at the slower of disk read and CRC-32 speed.
"""

import argparse
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from rlvr_jax.training import checkpoint_files as files
from rlvr_jax.training.checkpoint import Checkpointer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0, help="size of the state in GB")
    p.add_argument("--dir", default="/tmp/ckpt_cost", help="scratch directory (removed)")
    args = p.parse_args()
    n_arrays = 4
    per = int(args.gb * 1e9 / 4 / n_arrays)
    keys = jax.random.split(jax.random.key(0), n_arrays)
    state = {f"a{i}": jax.random.normal(k, (per,), jnp.float32) for i, k in enumerate(keys)}
    jax.block_until_ready(state)
    out = Path(args.dir)
    shutil.rmtree(out, ignore_errors=True)
    ckpt = Checkpointer(out, verify="off")  # the orbax save alone
    t0 = time.perf_counter()
    ckpt.save(1, state, {"step": 1})
    ckpt.close()
    save_s = time.perf_counter() - t0
    step_dir = out / "checkpoints" / "1"
    n, nbytes, manifest_s = files.write_manifest(step_dir, 0, checksum=True)
    check = files.verify(step_dir, 0, mode="checksum")
    sizes = files.verify(step_dir, 0, mode="size")
    assert check.status == "intact", check
    gb = nbytes / 1e9
    print(f"checkpoint: {n} files, {gb:.3f} GB on disk (state {args.gb:.3f} GB)")
    print(f"orbax save + wait (page cache): {save_s:.2f} s = {save_s / gb:.2f} s/GB")
    print(f"manifest (CRC-32): {manifest_s:.2f} s = {manifest_s / gb:.2f} s/GB")
    print(f"verify checksum:   {check.seconds:.2f} s = {check.seconds / gb:.2f} s/GB")
    print(f"verify sizes only: {sizes.seconds * 1e3:.1f} ms")
    print(f"manifest / save = {manifest_s / save_s:.2f}")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
