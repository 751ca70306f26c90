"""TorchScript on CUDA against eager, call by call: what PyTorch's TensorExpr fuser changes.

    python benchmarks/jit_fuser_parity.py [--preset vit_seed_tiny] [--batch 7] [--calls 5]

TorchScript's profiling executor runs a module's first calls as traced, then re-optimizes it
and, on CUDA, fuses elementwise ops into kernels it generates (NNC, the TensorExpr fuser).
The model is traced on CPU and loaded onto the GPU as `export` and `validate` do; each call's
logits are compared with eager's (max abs, and max abs over the largest logit), with the
fuser as PyTorch leaves it and with it off (`torch.jit.fuser("none")`). Then the ops the
fuser grouped, and each such op alone, scripted, against eager.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vit_export.model import create_model, random_input


def errors(reference: torch.Tensor, out: torch.Tensor) -> str:
    diff = (out.double() - reference.double()).abs().max().item()
    return f"max abs {diff:.3g}, max rel {diff / reference.abs().max().item():.3g}"


def traced_on_cuda(model, x) -> torch.jit.ScriptModule:
    """Traced on CPU, saved and loaded onto the GPU: the bundle's model.ts as validate runs it."""
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.trace(model, x), buffer)
    buffer.seek(0)
    return torch.jit.load(buffer, map_location="cuda").eval()


def fused_ops(graph) -> list[str]:
    groups = [n for n in graph.nodes() if n.kind() == "prim::TensorExprGroup"]
    return sorted({inner.kind() for g in groups for inner in g.g("Subgraph").nodes()
                   if not inner.kind().startswith("prim::Constant")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="vit_seed_tiny")
    parser.add_argument("--batch", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = create_model(args.preset).eval()
    x = random_input(model.config, args.batch, seed=0)
    with torch.no_grad():
        reference = model.cuda()(x.cuda())
        model.cpu()
        for fuser in ("default", "none"):
            ts = traced_on_cuda(model, random_input(model.config, 2, seed=1))
            # "default": PyTorch's own settings (on CUDA the TensorExpr fuser is on)
            with torch.jit.fuser("none") if fuser == "none" else contextlib.nullcontext():
                for call in range(1, args.calls + 1):
                    out = ts(x.cuda())
                    print(f"{args.preset} batch {args.batch}, fuser {fuser}, call {call}: "
                          f"{errors(reference, out)}")
                graph = torch.jit.last_executed_optimized_graph()
            print(f"  fused ops ({fuser}): {fused_ops(graph) or 'none'}")
        probe = torch.randn(args.batch, 17, 256, device="cuda") * 3
        ops = {"gelu": torch.nn.functional.gelu, "softmax": lambda t: t.softmax(-1),
               "scale_add": lambda t: t * 0.125 + t,
               "layer_norm": lambda t: torch.nn.functional.layer_norm(t, (256,))}
        for name, fn in ops.items():
            scripted = torch.jit.trace(fn, probe)
            for _ in range(args.calls):
                out = scripted(probe)
            print(f"op {name} alone, traced, call {args.calls}: {errors(fn(probe), out)}; "
                  f"fused: {fused_ops(torch.jit.last_executed_optimized_graph()) or 'none'}")


if __name__ == "__main__":
    main()
