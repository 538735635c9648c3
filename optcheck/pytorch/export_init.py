"""Export a PyTorch GPT's initial weights for the TorchSharp worker's ``--same-init``.

So that ``--backend pytorch,torchsharp --same-init`` starts both backends from the same
weights (the two libraries draw different random numbers from the same seed), the PyTorch
side writes the model it would train and the .NET trainer copies it into its own GPT
(``dotnet/Worker/InitManifest.cs``, ``GptTrainer.LoadInit``), name by name.

Format (a directory, ``optcheck.init/1``):

- one file per parameter of ``model.named_parameters()`` (PyTorch's order, duplicates
  removed, so a tied ``lm_head.weight`` appears once, as ``wte.weight``): the values as raw
  little-endian float32, row-major, ``NNN_<name>.f32``;
- ``manifest.json``: ``{"format": "optcheck.init/1", "params": [{"name", "dtype", "shape",
  "file", "bytes"}], ...}`` for people and Python;
- ``manifest.txt``: the same, one line per parameter, ``name TAB float32 TAB d0,d1 TAB file``
  (what the C# side reads: no JSON parser needed on .NET runtimes without System.Text.Json).

``python -m optcheck.pytorch.export_init --config CONFIG.json --out DIR`` exports the model
a PyTorch soak with that :class:`optcheck.config.SoakConfig` starts from (same seed, same
corpus vocabulary). Exit code 2 with one line for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from optcheck.config import SoakConfig
from optcheck.errors import InputError

FORMAT = "optcheck.init/1"


def _file_name(i: int, name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return f"{i:03d}_{safe}.f32"


def export_model(model: torch.nn.Module, out_dir: str | Path, meta: dict | None = None) -> Path:
    """Write ``model``'s parameters to ``out_dir`` (created) in the ``optcheck.init/1`` format.

    Args:
        model: any module; parameters are converted to float32 on the CPU.
        out_dir: the directory to write (existing ``*.f32`` / manifest files are replaced).
        meta: extra keys for ``manifest.json`` (e.g. the seed and model sizes).

    Returns:
        The directory.

    Raises:
        InputError: ``out_dir`` exists and is not a directory, or cannot be written.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for old in list(out.glob("*.f32")) + [out / "manifest.json", out / "manifest.txt"]:
            old.unlink(missing_ok=True)
        entries, lines = [], [f"# {FORMAT}: name<TAB>dtype<TAB>shape<TAB>file (raw little-endian float32)"]
        for i, (name, p) in enumerate(model.named_parameters()):
            arr = p.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
            fname = _file_name(i, name)
            (out / fname).write_bytes(arr.tobytes(order="C"))
            shape = list(arr.shape)
            entries.append({"name": name, "dtype": "float32", "shape": shape, "file": fname, "bytes": arr.nbytes})
            lines.append(f"{name}\tfloat32\t{','.join(str(d) for d in shape)}\t{fname}")
        (out / "manifest.txt").write_text("\n".join(lines) + "\n")
        doc = {"format": FORMAT, "byte_order": "little", "params": entries, **(meta or {})}
        (out / "manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as e:
        raise InputError(f"--out {out}: cannot write the initial weights ({e.strerror or e})") from None
    return out


def load_export(out_dir: str | Path) -> dict[str, np.ndarray]:
    """Read an export back: ``{name: float32 array of its shape}`` in manifest order.

    Raises:
        InputError: no manifest, another format, or a file of the wrong size.
    """
    d = Path(out_dir)
    try:
        doc = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{d}: no readable manifest.json ({e})") from None
    if doc.get("format") != FORMAT:
        raise InputError(f"{d}: format {doc.get('format')!r}, expected {FORMAT}")
    out = {}
    for e in doc["params"]:
        raw = (d / e["file"]).read_bytes()
        n = int(np.prod(e["shape"], dtype=np.int64))
        if len(raw) != 4 * n:
            raise InputError(f"{d / e['file']}: {len(raw)} bytes, expected {4 * n} for shape {e['shape']}")
        out[e["name"]] = np.frombuffer(raw, dtype="<f4").reshape(e["shape"]).copy()
    return out


def initial_model(cfg: SoakConfig, vocab_size: int) -> torch.nn.Module:
    """The GPT a PyTorch soak with ``cfg`` starts from: built as ``optcheck.pytorch.train.Trainer``
    builds it (``torch.manual_seed(cfg.run.seed)``, then ``GPT``), weights tied (TorchSharp's GPT ties too)."""
    from optcheck.pytorch.gpt import GPT, GPTConfig

    m = cfg.model
    torch.manual_seed(cfg.run.seed)
    return GPT(GPTConfig(block_size=m.block_size, vocab_size=vocab_size, n_layer=m.n_layer, n_head=m.n_head,
                         n_embd=m.n_embd, dropout=m.dropout, tie_weights=True))


def export_for_config(cfg: SoakConfig, out_dir: str | Path) -> Path:
    """Export the initial model of a soak with ``cfg`` (its corpus decides the vocabulary).

    Raises:
        InputError: bad data (``optcheck.data.load_corpus``) or an unwritable ``out_dir``.
    """
    from optcheck.data import load_corpus

    corpus = load_corpus(cfg.data.path, cfg.model.vocab_size)
    model = initial_model(cfg, corpus.vocab_size)
    m = cfg.model
    meta = {"seed": cfg.run.seed, "vocab_size": corpus.vocab_size, "block_size": m.block_size, "n_layer": m.n_layer,
            "n_head": m.n_head, "n_embd": m.n_embd, "torch": torch.__version__, "corpus_sha256": corpus.sha256}
    return export_model(model, out_dir, meta)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optcheck.pytorch.export_init",
                                 description="export the initial GPT weights of a PyTorch soak for --same-init")
    ap.add_argument("--config", required=True, help="SoakConfig as a JSON file")
    ap.add_argument("--out", required=True, help="directory to write")
    args = ap.parse_args(argv)
    try:
        try:
            cfg = SoakConfig.from_json(Path(args.config).read_text())
        except (OSError, ValueError, TypeError) as e:
            raise InputError(f"--config {args.config}: cannot read a SoakConfig ({e})") from None
        print(export_for_config(cfg, args.out))
    except InputError as e:
        print(f"optcheck: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
