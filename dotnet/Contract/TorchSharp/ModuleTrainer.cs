// Soak your own TorchSharp model: derive from ModuleTrainer, set Model and Optimizer in Setup, and
// write Step (examples/torchsharp-own-model/). The probe reads them through TorchSharpTarget, the
// same target GptTrainer uses: the named-parameter walk, the param groups of any built-in optimizer
// and its OptimizerHelper._state. Then
//     optcheck soak --backend torchsharp --dotnet-assembly Their.dll --dotnet-trainer Their.Trainer
// The Optimizer property hands Step a GuardedOptimizer over the user's optimizer: its zero_grad() and
// step() run the pre-step check first (virtual on TorchSharp's torch.optim.Optimizer from 0.99 to
// 0.107), so a parameter replaced, moved, registered late or disposed inside Step is named at that
// step, before TorchSharp throws (docs/torchsharp.md, "Checked inside the step").
// For C# code that does not run under optcheck, TorchSharpGuard.Wrap(model, optimizer) gives the same
// check as an optimizer that throws PreStepCheckException; TorchSharpGuard.For(...).Check() by hand.
using System;
using System.Collections.Generic;
using OptCheck.Probe;
using OptCheck.Worker;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OptCheck.Contract
{
    /// <summary>A user's own TorchSharp training loop for optcheck: implement Setup (build the model and
    /// optimizer, assign Model and Optimizer) and Step (one training step, optimizer.step() included).
    /// Optional: EvalLoss (held-out loss; default none), Inject / Scenarios (faults; default
    /// module-to-after-optimizer), Lifecycle (default none). The type needs a public parameterless
    /// constructor; its assembly must also compile in dotnet/Probe/*.cs, dotnet/Contract/**.cs and dotnet/Worker/TorchSharpProbe.cs
    /// (examples/torchsharp-own-model/*.csproj shows how).</summary>
    public abstract class ModuleTrainer : ITrainer, IGuardedTrainer
    {
        readonly TorchSharpTarget target;
        readonly PreStepGuard guard;
        optim.Optimizer optimizer;
        GuardedOptimizer guarded;

        protected ModuleTrainer()
        {
            target = new TorchSharpTarget(() => Model, () => optimizer);
            guard = new PreStepGuard(target);
        }

        /// <summary>The model the probe reads (set in Setup; set again if you rebuild it).</summary>
        public nn.Module Model { get; protected set; }

        /// <summary>Set: the optimizer the probe reads (in Setup; again if you rebuild it). Get: that optimizer
        /// wrapped in a GuardedOptimizer, whose zero_grad() and step() run the pre-step check first: call them
        /// through this property in Step, and a parameter replaced, moved, registered late or disposed earlier in
        /// the step is named before TorchSharp throws. Under optcheck the check records and never throws; outside
        /// it throws PreStepCheckException. The optimizer itself (e.g. for save_state_dict): UnguardedOptimizer.</summary>
        public optim.Optimizer Optimizer {
            get { return guarded; }
            protected set {
                optimizer = ReferenceEquals(value, null) ? null : GuardedOptimizer.Unwrap(value);
                guarded = ReferenceEquals(optimizer, null) ? null : GuardedOptimizer.Over(optimizer, guard.Before);
            }
        }

        /// <summary>The optimizer Setup assigned, not wrapped.</summary>
        public optim.Optimizer UnguardedOptimizer { get { return optimizer; } }

        PreStepGuard IGuardedTrainer.Guard { get { return guard; } }

        /// <summary>Parses the configuration JSON (TrainerOptions.FromJson), calls Setup(TrainerOptions),
        /// checks that Model and Optimizer are set.</summary>
        /// <exception cref="ArgumentException">not a JSON object, or a bad option value (reported as bad input).</exception>
        /// <exception cref="InvalidOperationException">Setup left Model or Optimizer null.</exception>
        public void Setup(string configJson)
        {
            Setup(TrainerOptions.FromJson(configJson));
            if (ReferenceEquals(Model, null) || ReferenceEquals(Optimizer, null))
                throw new InvalidOperationException(GetType().FullName + ".Setup must assign Model and Optimizer");
        }

        /// <summary>Build the model and optimizer from the soak's options (seed, lr, steps, ... and "extra.KEY").</summary>
        protected abstract void Setup(TrainerOptions options);

        public abstract double Step(long step, long[] inputs, long[] targets, int batch, int time);

        /// <summary>Held-out loss; NaN (the default) = this trainer has none, and the report shows no held-out loss.</summary>
        public virtual double EvalLoss(long[] inputs, long[] targets, int batch, int time) { return double.NaN; }

        IProbeTarget ITrainer.Target { get { return target; } }

        /// <summary>What the probe reads: Model and the unwrapped Optimizer, read live.</summary>
        public TorchSharpTarget Target { get { return target; } }

        public virtual string[] Scenarios { get { return new[] { "module-to-after-optimizer" }; } }

        /// <summary>module-to-after-optimizer: Model.to(float64) after the optimizer exists (seed 003).</summary>
        /// <exception cref="ArgumentException">a fault this trainer does not know.</exception>
        public virtual string Inject(string name)
        {
            if (name == "module-to-after-optimizer") {
                Model.to(ScalarType.Float64);
                return "model.to(ScalarType.Float64)";
            }
            throw new ArgumentException("scenario '" + name + "' is not implemented by " + GetType().FullName +
                                        " (it has: " + string.Join(", ", Scenarios) + "; override Inject for more)");
        }

        public virtual string Lifecycle(string kind)
        {
            throw new NotSupportedException(GetType().FullName + " has no lifecycle events (override Lifecycle for eval / checkpoint / resume)");
        }

        public virtual string[] Versions {
            get { return new[] { "torchsharp=" + TensorFacts.TorchSharpVersion(), "libtorch=" + torch.__version__ }; }
        }

        public virtual int Threads { get { return torch.get_num_threads(); } }

        /// <summary>The worker's pre-step check, for a Step that wants to stop itself: call before
        /// Optimizer.step(); throws PreStepCheckException naming the parameters.</summary>
        protected void CheckBeforeStep()
        {
            guard.Check();
        }
    }

    /// <summary>An optimizer that runs a check before each zero_grad() and step() of the optimizer it wraps, and
    /// forwards everything else (parameters(), ParamGroups, add_param_group) to it. It owns no native handle;
    /// disposing it disposes the wrapped optimizer. It is an optim.IMomentum / optim.IBetas exactly when the wrapped
    /// optimizer is (Over): OneCycleLR and CyclicLR ask the optimizer object itself for one of them when they cycle
    /// momentum (run on 0.107.0: "optimizer must support momentum with `cycle_momentum` option enabled").</summary>
    internal class GuardedOptimizer : optim.Optimizer
    {
        readonly optim.Optimizer inner;
        readonly Action<string> before;

        /// <summary>The wrapper for <paramref name="inner"/>: a GuardedOptimizer that is also an IMomentum or an
        /// IBetas when <paramref name="inner"/> is one.</summary>
        public static GuardedOptimizer Over(optim.Optimizer inner, Action<string> before)
        {
            if (inner is optim.IMomentum) return new GuardedMomentum(inner, before);
            if (inner is optim.IBetas) return new GuardedBetas(inner, before);
            return new GuardedOptimizer(inner, before);
        }

        /// <param name="inner">the optimizer to run</param>
        /// <param name="before">called with "zero_grad()" or "step()" before that call (PreStepGuard.Before)</param>
        protected GuardedOptimizer(optim.Optimizer inner, Action<string> before) : base(IntPtr.Zero)
        {
            if (ReferenceEquals(inner, null)) throw new ArgumentNullException("inner");
            if (before == null) throw new ArgumentNullException("before");
            this.inner = inner;
            this.before = before;
        }

        /// <summary>The wrapped optimizer.</summary>
        public optim.Optimizer Inner { get { return inner; } }

        /// <summary>The optimizer under any number of GuardedOptimizer wrappers.</summary>
        public static optim.Optimizer Unwrap(optim.Optimizer o)
        {
            var g = o as GuardedOptimizer;
            while (g != null) { o = g.inner; g = o as GuardedOptimizer; }
            return o;
        }

        public override void zero_grad()
        {
            before("zero_grad()");
            inner.zero_grad();
        }

        public override Tensor step(Func<Tensor> closure = null)
        {
            before("step()");
            return inner.step(closure);
        }

        public override IEnumerable<Parameter> parameters() { return inner.parameters(); }

        public override void add_param_group(ParamGroup param_group) { inner.add_param_group(param_group); }

        public override IEnumerable<optim.ILearningRateController> ParamGroups { get { return inner.ParamGroups; } }

        protected override void Dispose(bool disposing)
        {
            if (disposing) inner.Dispose();
        }
    }

    /// <summary>A GuardedOptimizer over an optimizer with momentum (SGD, RMSProp): the momentum is the wrapped one's.</summary>
    internal sealed class GuardedMomentum : GuardedOptimizer, optim.IMomentum
    {
        public GuardedMomentum(optim.Optimizer inner, Action<string> before) : base(inner, before) { }

        public double Momentum {
            get { return ((optim.IMomentum)Inner).Momentum; }
            set { ((optim.IMomentum)Inner).Momentum = value; }
        }
    }

    /// <summary>A GuardedOptimizer over an optimizer with betas (the Adam family): the betas are the wrapped one's.</summary>
    internal sealed class GuardedBetas : GuardedOptimizer, optim.IBetas
    {
        public GuardedBetas(optim.Optimizer inner, Action<string> before) : base(inner, before) { }

        public (double, double) Betas {
            get { return ((optim.IBetas)Inner).Betas; }
            set { ((optim.IBetas)Inner).Betas = value; }
        }
    }

    /// <summary>The pre-step guard over a TorchSharp (Module, Optimizer) pair, for loops run without optcheck.
    /// One line: <code>optimizer = TorchSharpGuard.Wrap(model, optimizer);</code> and every zero_grad() and step()
    /// is checked first (PreStepCheckException naming the parameters, before TorchSharp's KeyNotFoundException
    /// or "Tensor invalid -- empty handle"); or by hand: <code>var guard = TorchSharpGuard.For(model, optimizer);
    /// ... guard.Check(); optimizer.step();</code></summary>
    public static class TorchSharpGuard
    {
        /// <summary>The optimizer wrapped so that its zero_grad() and step() run the pre-step check first and
        /// throw PreStepCheckException when the optimizer no longer matches the model.</summary>
        public static optim.Optimizer Wrap(nn.Module model, optim.Optimizer optimizer)
        {
            optim.Optimizer inner = GuardedOptimizer.Unwrap(optimizer);
            var guard = new PreStepGuard(new TorchSharpTarget(model, inner));
            return GuardedOptimizer.Over(inner, guard.Before);
        }

        /// <summary>A guard over this model and optimizer (fixed: make a new one if you rebuild either).</summary>
        public static PreStepGuard For(nn.Module model, optim.Optimizer optimizer)
        {
            return new PreStepGuard(new TorchSharpTarget(model, optimizer));
        }

        /// <summary>A guard that reads the model and optimizer through getters (they may be rebuilt).</summary>
        public static PreStepGuard For(Func<nn.Module> model, Func<optim.Optimizer> optimizer)
        {
            return new PreStepGuard(new TorchSharpTarget(model, optimizer));
        }
    }
}
