// Soak your own TorchSharp model: derive from ModuleTrainer, set Model and Optimizer in Setup, and
// write Step (examples/torchsharp-own-model/). The probe reads them through TorchSharpTarget, the
// same target GptTrainer uses: the named-parameter walk, the param groups of any built-in optimizer
// and its OptimizerHelper._state. Then
//     optcheck soak --backend torchsharp --dotnet-assembly Their.dll --dotnet-trainer Their.Trainer
// For C# code that does not run under optcheck, TorchSharpGuard.For(model, optimizer) gives the
// worker's pre-step check as a PreStepGuard to call before optimizer.step().
using System;
using System.Collections.Generic;
using OptCheck.Probe;
using TorchSharp;
using static TorchSharp.torch;

namespace OptCheck.Worker
{
    /// <summary>A user's own TorchSharp training loop for optcheck: implement Setup (build the model and
    /// optimizer, assign Model and Optimizer) and Step (one training step, optimizer.step() included).
    /// Optional: EvalLoss (held-out loss; default none), Inject / Scenarios (faults; default
    /// module-to-after-optimizer), Lifecycle (default none). The type needs a public parameterless
    /// constructor; its assembly must also compile in dotnet/Probe/*.cs and dotnet/Worker/TorchSharpProbe.cs
    /// and ModuleTrainer.cs (examples/torchsharp-own-model/*.csproj shows how).</summary>
    public abstract class ModuleTrainer : ITrainer
    {
        readonly TorchSharpTarget target;
        PreStepGuard guard;

        protected ModuleTrainer()
        {
            target = new TorchSharpTarget(() => Model, () => Optimizer);
        }

        /// <summary>The model the probe reads (set in Setup; set again if you rebuild it).</summary>
        public nn.Module Model { get; protected set; }
        /// <summary>The optimizer the probe reads (set in Setup; set again if you rebuild it).</summary>
        public optim.Optimizer Optimizer { get; protected set; }

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

        public IProbeTarget Target { get { return target; } }

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
            if (guard == null) guard = new PreStepGuard(target);
            guard.Check();
        }
    }

    /// <summary>The pre-step guard over a TorchSharp (Module, Optimizer) pair, for loops run without optcheck:
    /// <code>var guard = TorchSharpGuard.For(model, optimizer); ... guard.Check(); optimizer.step();</code></summary>
    public static class TorchSharpGuard
    {
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
