// The contract between optcheck's Python bridge (optcheck/torchsharp_bridge/) and a .NET
// training loop. Free of TorchSharp types: it compiles with Debian's `mcs` (C# 7) for the
// tests here, and is included as source in the SDK-style net8.0 worker project (part 2),
// whose TorchSharp adapter implements these interfaces.
//
// Identities (docs/torchsharp.md): Handle is the key the optimizer keeps its per-parameter state
// under (TorchSharp: Tensor.Handle, the address of the native tensor wrapper; AdamW.step
// looks up _state[param.handle]); DataPtr is the address of the tensor's data (LibTorchSharp
// THSTensor_data). Two handles can share one data pointer (weight tying, Module.to converting
// native modules in place).
using System;
using System.Collections.Generic;
using OptCheck.Contract;

namespace OptCheck.Probe
{
    /// <summary>One tensor as the probe sees it: a model parameter or an optimizer member.</summary>
    internal interface IParameterView
    {
        /// <summary>Name from model.named_parameters(); null for an optimizer member the adapter cannot name.</summary>
        string Name { get; }
        /// <summary>The optimizer-state key (TorchSharp: Tensor.Handle.ToInt64()).</summary>
        long Handle { get; }
        /// <summary>Address of the tensor's data (TorchSharp: THSTensor_data); 0 = unknown.</summary>
        long DataPtr { get; }
        bool IsLeaf { get; }
        bool RequiresGrad { get; }
        /// <summary>Shape, e.g. {64, 192}; empty for a scalar.</summary>
        long[] Shape { get; }
        /// <summary>Element type in PyTorch's spelling: "float32", "float64", "bfloat16", "int64".</summary>
        string DType { get; }
        /// <summary>"cpu", "cuda:0".</summary>
        string Device { get; }
        /// <summary>True when .grad is not null.</summary>
        bool HasGrad { get; }
        /// <summary>L2 norm of .grad; double.NaN when there is none. Called only when a snapshot is taken.</summary>
        double GradNorm();
    }

    /// <summary>Optional, next to IParameterView: the parameter's values, read when a snapshot is taken.</summary>
    internal interface IParameterValues
    {
        /// <summary>L2 norm of the values (<paramref name="valueNorm"/>, NaN = unknown) and the checksum
        /// (ValueStats: the wrapping sum of the values' bit patterns, as optcheck/pytorch/probe.py sums them);
        /// returns false when the checksum is unknown (then <paramref name="checksum"/> is 0).</summary>
        bool ReadValues(out double valueNorm, out long checksum);
    }

    /// <summary>One optimizer param group.</summary>
    internal interface IParamGroupView
    {
        /// <summary>Option names, e.g. lr, beta1, beta2, eps, weight_decay (parallel to OptionValues).</summary>
        string[] OptionNames { get; }
        double[] OptionValues { get; }
        /// <summary>The tensors the optimizer will step at its next step(), in order. TorchSharp's
        /// ParamGroup.Parameters may be a lazy enumerable over the model: enumerate it afresh on
        /// every call (that is what step() does).</summary>
        IList<IParameterView> Members();
    }

    /// <summary>What the probe reads: a model and its optimizer, in their current state.</summary>
    internal interface IProbeTarget
    {
        /// <summary>The model's parameters, model.named_parameters() order, read afresh on every call.</summary>
        IList<IParameterView> ModelParameters();
        /// <summary>The optimizer's param groups.</summary>
        IList<IParamGroupView> ParamGroups();
        /// <summary>The object whose non-public instance field StateFieldName holds the per-parameter
        /// state dictionary (TorchSharp: the optimizer; field "_state" declared on
        /// TorchSharp.Modules.OptimizerHelper, an OrderedDict&lt;IntPtr, OptimizerState&gt;).
        /// null = the optimizer has no readable state (the snapshot says so).</summary>
        object StateOwner { get; }
        string StateFieldName { get; }
        /// <summary>Describe one state entry (its key is a handle). Return null to let the probe
        /// read it by reflection: a long/int field or property named "step", and every field or
        /// property whose value has a long[] "shape" property (and a "dtype") as a state tensor.</summary>
        StateView DescribeState(object key, object value);
        /// <summary>Optimizer class name, e.g. "AdamW".</summary>
        string OptimizerType { get; }
        /// <summary>Live tensors (TorchSharp: Tensor.TotalCount); -1 = unknown.</summary>
        long LiveTensors { get; }
        /// <summary>Peak live tensors (TorchSharp: Tensor.PeakCount); -1 = unknown.</summary>
        long PeakTensors { get; }
    }

    /// <summary>Optional, next to IProbeTarget: the training thread's DisposeScope bookkeeping
    /// (TorchSharp: DisposeScopeManager.Statistics, a per-thread ThreadDisposeScopeStatistics).
    /// Cumulative counts since the thread started; -1 = unknown. Read on the thread that runs
    /// the training step (the probe runs there). Rule OC402 uses created minus disposed.</summary>
    internal interface IDisposeScopeStatistics
    {
        /// <summary>Tensors created while no DisposeScope was open (CreatedOutsideScopeCount).</summary>
        long TensorsCreatedOutsideScope { get; }
        /// <summary>Of those, disposed by this thread (DisposedOutsideScopeCount); the rest wait for the GC.</summary>
        long TensorsDisposedOutsideScope { get; }
        /// <summary>Tensors taken out of a DisposeScope (DetachedFromScopeCount: MoveToOuterDisposeScope with no outer
        /// scope, DetachFromDisposeScope); -1 when not counted.</summary>
        long TensorsDetachedFromScope { get; }
        /// <summary>Tensors put into a DisposeScope after their creation (AttachedToScopeCount); -1 when not counted.</summary>
        long TensorsAttachedToScope { get; }
    }

    /// <summary>One optimizer-state entry, as IProbeTarget.DescribeState reports it.</summary>
    internal sealed class StateView
    {
        /// <summary>The entry's step counter; -1 = none.</summary>
        public long Step = -1;
        public readonly List<string> TensorNames = new List<string>();
        public readonly List<long[]> TensorShapes = new List<long[]>();
        public readonly List<string> TensorDTypes = new List<string>();

        public StateView Add(string name, long[] shape, string dtype)
        {
            TensorNames.Add(name);
            TensorShapes.Add(shape ?? new long[0]);
            TensorDTypes.Add(dtype);
            return this;
        }
    }

    /// <summary>A training loop the Python worker drives one call per step (through OptCheck.Probe.Driver).
    /// The type must have a public parameterless constructor; its name is given to the worker as
    /// SoakConfig.extra["dotnet_trainer"] and it lives in the assembly SoakConfig.extra["dotnet_assembly"],
    /// which also contains the OptCheck.Probe sources.</summary>
    internal interface ITrainer
    {
        /// <summary>Build model and optimizer from <paramref name="configJson"/>, one JSON object: every scalar
        /// field of optcheck.config.SoakConfig (seed, block_size, batch_size, n_layer, n_head, n_embd, dropout,
        /// lr, min_lr, warmup_steps, weight_decay, beta1, beta2, eps, grad_clip, threads, steps, work_dir,
        /// run_id, ...), "vocab_size" (the corpus's) and "extra" (SoakConfig.extra). TrainerOptions.FromJson
        /// reads it (extra entries as "extra.KEY"). Throw ArgumentException for a bad value (the worker
        /// reports it as bad input).</summary>
        void Setup(string configJson);
        /// <summary>One training step (1-based) on inputs/targets, row-major (batch, time) token ids;
        /// returns the loss. zero_grad, forward, backward, clip, optimizer.step() all happen here.</summary>
        double Step(long step, long[] inputs, long[] targets, int batch, int time);
        /// <summary>Loss on a held-out batch, no gradients, no optimizer step.</summary>
        double EvalLoss(long[] inputs, long[] targets, int batch, int time);
        /// <summary>The model and optimizer the probe reads.</summary>
        IProbeTarget Target { get; }
        /// <summary>Names of the faults Inject knows.</summary>
        string[] Scenarios { get; }
        /// <summary>Plant fault NAME now (before the step); return the call made, e.g.
        /// "model.to(ScalarType.Float64)". Throw ArgumentException for an unknown name.</summary>
        string Inject(string name);
        /// <summary>Run lifecycle event "eval", "checkpoint" or "resume"; return what was done.
        /// Throw NotSupportedException when the trainer has none.</summary>
        string Lifecycle(string kind);
        /// <summary>"name=value" pairs for the snapshot's versions, e.g. "torchsharp=0.105.0".</summary>
        string[] Versions { get; }
        /// <summary>Intra-op threads in use.</summary>
        int Threads { get; }
    }
}
