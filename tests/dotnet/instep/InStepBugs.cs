// A user's own TorchSharp trainer with the five identity bugs planted INSIDE its Step, before its own
// optimizer calls (tests/unit/test_torchsharp_instep_sources.py compiles it with dotnet/Probe,
// Worker/TorchSharpProbe.cs and Contract/** against TorchSharp 0.107.0's own reference
// assembly and against the signature stub). Under optcheck, ModuleTrainer.Optimizer is a
// GuardedOptimizer: each bug is named at its step, phase in-step, before TorchSharp throws. The same
// loop without optcheck (PlainLoop) wraps its optimizer once with TorchSharpGuard.Wrap and gets
// PreStepCheckException instead of TorchSharp's exception.
//   extra.bug: to-float64 | param-replaced | register-late | eager-to-float64 | dispose; extra.bug_at: step
using System;
using System.Linq;
using OptCheck.Contract;
using OptCheck.Probe;
using OptCheck.Worker;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OptCheckInStep
{
    public sealed class TwoLayer : nn.Module<Tensor, Tensor>
    {
        public Embedding emb;
        public Linear head;
        public Parameter scale;   // a learned Parameter field, as in the model

        public TwoLayer(long vocab, long width) : base("TwoLayer")
        {
            emb = nn.Embedding(vocab, width);
            head = nn.Linear(width, vocab, true);
            scale = new Parameter(torch.ones(width));
            RegisterComponents();
        }

        public override Tensor forward(Tensor idx)
        {
            return head.call(emb.call(idx) * scale);
        }
    }

    public sealed class BuggyTrainer : ModuleTrainer
    {
        TwoLayer model;
        string bug;
        long bugAt;

        protected override void Setup(TrainerOptions o)
        {
            bug = o.String("extra.bug", "");
            bugAt = o.Long("extra.bug_at", -1);
            model = new TwoLayer(o.Long("vocab_size", 256), o.Long("n_embd", 32));
            Model = model;
            Optimizer = bug == "eager-to-float64"
                ? torch.optim.AdamW(model.parameters().ToList(), o.Double("lr", 1e-3))   // a materialised list
                : torch.optim.AdamW(model.parameters(), o.Double("lr", 1e-3));
        }

        void Plant()
        {
            switch (bug) {
                case "to-float64": model.to(ScalarType.Float64); break;
                case "param-replaced": model.head.weight = new Parameter(model.head.weight.detach().clone()); break;
                case "register-late": model.register_parameter("bias2", new Parameter(torch.zeros(model.head.weight.shape[0]))); break;
                case "eager-to-float64": model.to(ScalarType.Float64); break;   // disposes what the list holds (0.107)
                case "dispose": model.get_parameter("scale").Dispose(); break;
                default: throw new ArgumentException("no bug '" + bug + "'");
            }
        }

        public override double Step(long step, long[] inputs, long[] targets, int batch, int time)
        {
            using (DisposeScope scope = torch.NewDisposeScope()) {
                bool early = bug == "eager-to-float64" || bug == "dispose";
                if (step == bugAt && early) Plant();           // before the user's zero_grad()
                Optimizer.zero_grad();
                Tensor x = torch.tensor(inputs).view(batch, time);
                Tensor y = torch.tensor(targets).view(batch, time);
                Tensor logits = model.call(x);
                Tensor loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[2]), y.view(-1));
                loss.backward();
                if (step == bugAt && !early) Plant();          // between backward and the user's step()
                Optimizer.step();
                return loss.to(ScalarType.Float64).item<double>();
            }
        }
    }

    /// <summary>The same loop without optcheck: the optimizer wrapped once; every zero_grad()/step() checked.</summary>
    public static class PlainLoop
    {
        /// <exception cref="PreStepCheckException">the optimizer no longer matches the model (structured problems).</exception>
        public static void Train(TwoLayer model, long[] inputs, long[] targets, int batch, int time, int steps, Action<long> bug)
        {
            optim.Optimizer optimizer = TorchSharpGuard.Wrap(model, torch.optim.AdamW(model.parameters(), 1e-3));
            for (long step = 1; step <= steps; step++) {
                using (DisposeScope scope = torch.NewDisposeScope()) {
                    optimizer.zero_grad();
                    Tensor x = torch.tensor(inputs).view(batch, time);
                    Tensor y = torch.tensor(targets).view(batch, time);
                    Tensor logits = model.call(x);
                    nn.functional.cross_entropy(logits.view(-1, logits.shape[2]), y.view(-1)).backward();
                    bug(step);
                    optimizer.step();
                }
            }
        }
    }
}
