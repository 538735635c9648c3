// The TorchSharp GPT: the same model as optcheck/pytorch/gpt.py, module for module and name
// for name, so that runs of the two backends align parameter by parameter:
//   wte, wpe, h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc,
//   h.N.mlp.c_proj, ln_f  (+ lm_head, tied to wte: see GPT below).
//
// Written against the TorchSharp API that exists from 0.99.6 to 0.107 (checked in
// github dotnet/TorchSharp at tag v0.99.6 and at 0.107's main): no scaled_dot_product_attention
// (attention is written out, q·kᵀ/√d, causal mask, softmax, ·v — as gpt.py does), Module<Tensor,
// Tensor> + RegisterComponents (parameter names are the field names), nn.Linear, nn.Embedding,
// ModuleList, functional.layer_norm / gelu / softmax / linear. C# 7 only (no switch patterns, no
// foreach deconstruction) so that tests/dotnet/torchsharp_stub compiles it with Debian's mcs.
using System;
using System.Collections.Generic;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OptCheck.Worker
{
    /// <summary>Model sizes, as optcheck.config.SoakConfig / optcheck.pytorch.gpt.GPTConfig name them.</summary>
    public sealed class GPTConfig
    {
        public long BlockSize = 64, VocabSize = 256, NLayer = 2, NHead = 2, NEmbd = 64;
        /// <summary>"once" (default): lm_head reuses wte's registered Parameter object, so
        /// named_parameters() (which skips a handle it has seen: Module.cs) lists the tensor once,
        /// as wte.weight, like PyTorch. "obvious": lm_head is an nn.Linear and
        /// <c>lm_head.weight = wte.weight</c> — on 0.99.6 the getter returns a new wrapper, so two
        /// handles, two optimizer states, one tensor (docs/torchsharp.md, fixture …-tied.jsonl).</summary>
        public string Tie = "once";
    }

    /// <summary>nanoGPT's LayerNorm: two plain Parameter fields (the kind TorchSharp's Module.to
    /// rebuilds as new non-leaf tensors, docs/torchsharp.md), F.layer_norm with eps 1e-5.</summary>
    public sealed class LayerNorm : nn.Module<Tensor, Tensor>
    {
        // Field names are the parameter names (RegisterComponents); keep them as they are.
        public Parameter weight;
        public Parameter bias;
        /// <summary>Null until the param-registered-late fault registers it (then y * gain).</summary>
        public Parameter gain;
        readonly long[] shape;

        public LayerNorm(long ndim) : base("LayerNorm")
        {
            shape = new long[] { ndim };
            weight = new Parameter(torch.ones(ndim), true);
            bias = new Parameter(torch.zeros(ndim), true);
            RegisterComponents();
        }

        public override Tensor forward(Tensor x)
        {
            Tensor y = nn.functional.layer_norm(x, shape, weight, bias, 1e-5);
            return ReferenceEquals(gain, null) ? y : y.mul(gain);  // never gain == null: Tensor's == is element-wise from 0.10x
        }

        /// <summary>The late parameter of fault param-registered-late: registered on the module
        /// after the optimizer exists (Module.register_parameter) and used by forward.</summary>
        public void AddGain()
        {
            gain = new Parameter(torch.ones(shape[0], dtype: weight.dtype, device: weight.device), true);
            register_parameter("gain", gain);
        }
    }

    public sealed class CausalSelfAttention : nn.Module<Tensor, Tensor>
    {
        public Linear c_attn;
        public Linear c_proj;
        readonly long nHead, nEmbd;

        public CausalSelfAttention(GPTConfig c) : base("CausalSelfAttention")
        {
            if (c.NEmbd % c.NHead != 0) throw new ArgumentException("n_embd (" + c.NEmbd + ") must be a multiple of n_head (" + c.NHead + ")");
            c_attn = nn.Linear(c.NEmbd, 3 * c.NEmbd, true);
            c_proj = nn.Linear(c.NEmbd, c.NEmbd, true);
            nHead = c.NHead;
            nEmbd = c.NEmbd;
            RegisterComponents();
        }

        public override Tensor forward(Tensor x)
        {
            long B = x.shape[0], T = x.shape[1], C = x.shape[2];
            long hs = C / nHead;
            Tensor[] qkv = c_attn.call(x).split(nEmbd, 2);
            Tensor q = qkv[0].view(B, T, nHead, hs).transpose(1, 2);  // (B, nh, T, hs)
            Tensor k = qkv[1].view(B, T, nHead, hs).transpose(1, 2);
            Tensor v = qkv[2].view(B, T, nHead, hs).transpose(1, 2);
            Tensor att = q.matmul(k.transpose(-2, -1)).mul((Scalar)(1.0 / Math.Sqrt(hs)));  // (B, nh, T, T)
            // gpt.py: masked_fill(~tril(ones(T, T, bool)), -inf). The mask is made here rather than
            // held as a Tensor field: a field would be registered as a buffer and converted to the
            // float dtype by Module.to (Module.cs _toEpilog), which masked_fill cannot use.
            // On x's device: a CPU mask against CUDA scores fails at the first forward.
            Tensor future = torch.ones(T, T, dtype: ScalarType.Bool, device: x.device).triu(1);
            att = att.masked_fill(future, (Scalar)double.NegativeInfinity);
            att = nn.functional.softmax(att, -1);
            Tensor y = att.matmul(v).transpose(1, 2).contiguous().view(B, T, C);
            return c_proj.call(y);
        }
    }

    public sealed class MLP : nn.Module<Tensor, Tensor>
    {
        public Linear c_fc;
        public Linear c_proj;

        public MLP(GPTConfig c) : base("MLP")
        {
            c_fc = nn.Linear(c.NEmbd, 4 * c.NEmbd, true);
            c_proj = nn.Linear(4 * c.NEmbd, c.NEmbd, true);
            RegisterComponents();
        }

        public override Tensor forward(Tensor x)
        {
            return c_proj.call(nn.functional.gelu(c_fc.call(x)));
        }
    }

    public sealed class Block : nn.Module<Tensor, Tensor>
    {
        public LayerNorm ln_1;
        public CausalSelfAttention attn;
        public LayerNorm ln_2;
        public MLP mlp;

        public Block(GPTConfig c) : base("Block")
        {
            ln_1 = new LayerNorm(c.NEmbd);
            attn = new CausalSelfAttention(c);
            ln_2 = new LayerNorm(c.NEmbd);
            mlp = new MLP(c);
            RegisterComponents();
        }

        public override Tensor forward(Tensor x)
        {
            x = x.add(attn.call(ln_1.call(x)));
            return x.add(mlp.call(ln_2.call(x)));
        }
    }

    /// <summary>Decoder-only transformer: forward(idx (B, T) int64) -> logits (B, T, vocab).</summary>
    public sealed class GPT : nn.Module<Tensor, Tensor>
    {
        public Embedding wte;
        public Embedding wpe;
        public ModuleList<Block> h;
        public LayerNorm ln_f;
        /// <summary>Null with Tie "once" (the head multiplies by wte's registered weight).</summary>
        public Linear lm_head;

        public readonly GPTConfig Config;

        public GPT(GPTConfig c) : base("GPT")
        {
            Config = c;
            wte = nn.Embedding(c.VocabSize, c.NEmbd);
            wpe = nn.Embedding(c.BlockSize, c.NEmbd);
            var blocks = new Block[c.NLayer];
            for (int i = 0; i < blocks.Length; i++) blocks[i] = new Block(c);
            h = new ModuleList<Block>(blocks);
            ln_f = new LayerNorm(c.NEmbd);
            if (c.Tie == "obvious") lm_head = nn.Linear(c.NEmbd, c.VocabSize, false);
            else if (c.Tie != "once") throw new ArgumentException("tie must be 'once' or 'obvious', got '" + c.Tie + "'");
            RegisterComponents();
            if (lm_head != null) lm_head.weight = wte.weight;  // the obvious tie (see GPTConfig.Tie)
            InitWeights();
        }

        /// <summary>wte's registered weight: the Parameter object named_parameters() returns,
        /// never the Embedding.weight getter (a new wrapper per read on 0.99.6, docs/torchsharp.md).</summary>
        public Parameter TiedWeight()
        {
            return wte.get_parameter("weight");
        }

        /// <summary>gpt.py's init: normal(0, 0.02) for Linear and Embedding weights, zero biases,
        /// normal(0, 0.02/sqrt(2 n_layer)) for every c_proj.weight; LayerNorm ones/zeros.
        /// Same distributions as PyTorch, not the same random numbers: --same-init loads
        /// PyTorch's own initial weights instead (Trainer.LoadInit).</summary>
        void InitWeights()
        {
            double projStd = 0.02 / Math.Sqrt(2.0 * Config.NLayer);
            using (torch.no_grad()) {
                foreach (var np in named_parameters()) {
                    string name = np.name;
                    Parameter p = np.parameter;
                    if (name.StartsWith("ln_") || name.Contains(".ln_")) continue;  // ones / zeros already
                    if (name.EndsWith(".bias")) nn.init.zeros_(p);
                    else if (name.EndsWith("c_proj.weight")) nn.init.normal_(p, 0.0, projStd);
                    else nn.init.normal_(p, 0.0, 0.02);
                }
            }
        }

        public override Tensor forward(Tensor idx)
        {
            long T = idx.shape[1];
            Tensor pos = torch.arange(0L, T, dtype: ScalarType.Int64, device: idx.device);  // idx's device, as gpt.py
            Tensor x = wte.call(idx).add(wpe.call(pos));
            for (int i = 0; i < h.Count; i++) x = h[i].call(x);
            x = ln_f.call(x);
            return lm_head != null ? lm_head.call(x) : nn.functional.linear(x, TiedWeight());
        }

        /// <summary>Mean cross-entropy of logits (B, T, V) against targets (B, T).</summary>
        public static Tensor Loss(Tensor logits, Tensor targets)
        {
            long V = logits.shape[2];
            return nn.functional.cross_entropy(logits.view(-1, V), targets.reshape(-1));
        }
    }
}
