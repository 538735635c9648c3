// A user's own TorchSharp model and AdamW loop, soaked by optcheck (README.md beside this file).
//
// BigramMlp: token embedding -> Linear -> GELU -> Linear back to the vocabulary, trained on
// next-byte prediction. OwnTrainer derives from OptCheck.Contract.ModuleTrainer and writes only
// Setup (model + optimizer) and Step; optcheck's probe reads the model's named parameters, the
// AdamW param groups and AdamW's per-parameter state through ModuleTrainer.Model / .Optimizer.
//
// Step calls the optimizer through ModuleTrainer.Optimizer, a GuardedOptimizer: its zero_grad() and
// step() run optcheck's pre-step check first, so a parameter replaced, moved, registered late or
// disposed earlier in the same Step is named at that step, before TorchSharp throws.
//
// StandaloneLoop is the same training without optcheck or Python: its optimizer is wrapped once
// (TorchSharpGuard.Wrap), and every zero_grad()/step() throws PreStepCheckException naming the
// parameters where TorchSharp would throw KeyNotFoundException with a bare handle, or
// "Tensor invalid -- empty handle".
//
// C# 7 (Mono's mcs compiles it); every Tensor null check is ReferenceEquals (Tensor's == is
// element-wise from TorchSharp 0.10x).
using System;
using OptCheck.Contract;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OwnModel
{
    /// <summary>forward(idx (B, T) int64) -> logits (B, T, vocab).</summary>
    public sealed class BigramMlp : nn.Module<Tensor, Tensor>
    {
        // field names are the parameter names (RegisterComponents): emb.weight, hidden.weight, ...
        public Embedding emb;
        public Linear hidden;
        public Linear head;

        public BigramMlp(long vocab, long width) : this(vocab, width, 4 * width) { }

        public BigramMlp(long vocab, long width, long hiddenWidth) : base("BigramMlp")
        {
            emb = nn.Embedding(vocab, width);
            hidden = nn.Linear(width, hiddenWidth, true);
            head = nn.Linear(hiddenWidth, vocab, true);
            RegisterComponents();
        }

        public override Tensor forward(Tensor idx)
        {
            return head.call(nn.functional.gelu(hidden.call(emb.call(idx))));
        }

        /// <summary>Mean cross-entropy of this model's logits on (B, T) inputs against (B, T) targets.</summary>
        public Tensor Loss(Tensor inputs, Tensor targets)
        {
            Tensor logits = call(inputs);
            long V = logits.shape[2];
            return nn.functional.cross_entropy(logits.view(-1, V), targets.reshape(-1));
        }
    }

    /// <summary>The trainer optcheck drives: --dotnet-trainer OwnModel.OwnTrainer.</summary>
    public sealed class OwnTrainer : ModuleTrainer
    {
        BigramMlp model;

        protected override void Setup(TrainerOptions o)
        {
            torch.manual_seed(o.Long("seed", 1337));
            torch.set_num_threads((int)o.Long("threads", 1));
            long vocab = o.Long("extra.corpus_vocab_size", o.Long("vocab_size", 256));
            long width = o.Long("n_embd", 64);
            // a setting of this trainer's own: optcheck soak --trainer-option n_hidden=256
            model = new BigramMlp(vocab, width, o.Long("extra.n_hidden", 4 * width));
            Model = model;
            // model.parameters() is lazy: AdamW re-walks the model at every step() (TorchSharp's usual pattern)
            Optimizer = torch.optim.AdamW(model.parameters(), o.Double("lr", 1e-3), 0.9, 0.95, 1e-8, o.Double("weight_decay", 0.1));
        }

        public override double Step(long step, long[] inputs, long[] targets, int batch, int time)
        {
            using (DisposeScope scope = torch.NewDisposeScope()) {
                Optimizer.zero_grad();   // through ModuleTrainer.Optimizer: checked first
                Device device = model.emb.weight.device;
                Tensor x = torch.tensor(inputs, device: device).view(batch, time);
                Tensor y = torch.tensor(targets, device: device).view(batch, time);
                Tensor loss = model.Loss(x, y);
                loss.backward();
                Optimizer.step();
                return loss.to(ScalarType.Float64).item<double>();
            }
        }

        public override double EvalLoss(long[] inputs, long[] targets, int batch, int time)
        {
            using (torch.no_grad())
            using (DisposeScope scope = torch.NewDisposeScope()) {
                Device device = model.emb.weight.device;
                Tensor x = torch.tensor(inputs, device: device).view(batch, time);
                Tensor y = torch.tensor(targets, device: device).view(batch, time);
                return model.Loss(x, y).to(ScalarType.Float64).item<double>();
            }
        }
    }

    /// <summary>The same training with no optcheck and no Python: the optimizer wrapped once, every call checked.</summary>
    public static class StandaloneLoop
    {
        /// <summary>Train <paramref name="steps"/> steps on a repeating byte pattern; returns the last loss.</summary>
        /// <exception cref="PreStepCheckException">the optimizer no longer matches the model (names the parameters).</exception>
        public static double Train(int steps)
        {
            const int B = 4, T = 16, V = 128;
            torch.manual_seed(1);
            var model = new BigramMlp(V, 32);
            // one line: every zero_grad() and step() of this optimizer runs the pre-step check first
            optim.Optimizer optimizer = TorchSharpGuard.Wrap(model, torch.optim.AdamW(model.parameters(), 3e-3));
            var x = new long[B * T];
            var y = new long[B * T];
            double last = double.NaN;
            for (int step = 1; step <= steps; step++) {
                for (int i = 0; i < x.Length; i++) { x[i] = 97 + (i + step) % 7; y[i] = 97 + (i + step + 1) % 7; }
                using (DisposeScope scope = torch.NewDisposeScope()) {
                    optimizer.zero_grad();
                    Tensor loss = model.Loss(torch.tensor(x).view(B, T), torch.tensor(y).view(B, T));
                    loss.backward();
                    optimizer.step();   // PreStepCheckException naming the parameters, instead of
                                        // KeyNotFoundException for a bare handle
                    last = loss.to(ScalarType.Float64).item<double>();
                }
            }
            return last;
        }
    }
}
