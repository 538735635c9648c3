// TorchSharpTarget: what optcheck's probe reads from a TorchSharp (Module, Optimizer) pair. Public (the
// user contract); the probe reaches it through the internal IProbeTarget, implemented explicitly, so
// that nothing of the probe's own types becomes public in a user's assembly. The TorchSharp readers it
// uses (TsParameterView, TsGroupView, OptionReader, TensorFacts) are in dotnet/Worker/TorchSharpProbe.cs.
using System;
using System.Collections.Generic;
using System.Reflection;
using System.Runtime.InteropServices;
using OptCheck.Probe;
using OptCheck.Worker;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OptCheck.Contract
{
    /// <summary>IProbeTarget over any TorchSharp (Module, Optimizer) pair, read through two getters so
    /// that a trainer which rebuilds either (resume) is always read live: the model's
    /// named_parameters() walk, the optimizer's param groups (any built-in optimizer: their options by
    /// reflection, OptionReader) and its per-parameter state (OptimizerHelper._state, where all twelve
    /// built-in optimizers keep it, docs/torchsharp.md). GptTrainer and ModuleTrainer (a user's own
    /// model) both use it; PreStepGuard checks it before a step.</summary>
    public sealed class TorchSharpTarget : IProbeTarget, IDisposeScopeStatistics, IProbeNotes
    {
        /// <summary>OptimizerHelper._state, or null when this TorchSharp has no such field.</summary>
        public static readonly FieldInfo StateField =
            typeof(OptimizerHelper).GetField("_state", BindingFlags.Instance | BindingFlags.NonPublic | BindingFlags.Public);

        /// <summary>Optimizer.handle (internal HType, a SafeHandle): set for libtorch's native optimizers only.</summary>
        static readonly FieldInfo NativeHandleField =
            typeof(optim.Optimizer).GetField("handle", BindingFlags.Instance | BindingFlags.NonPublic | BindingFlags.Public);

        readonly Func<nn.Module> model;
        readonly Func<optim.Optimizer> optimizer;

        /// <param name="model">returns the model now (read on every probe call)</param>
        /// <param name="optimizer">returns the optimizer now (read on every probe call; a GuardedOptimizer is read through)</param>
        public TorchSharpTarget(Func<nn.Module> model, Func<optim.Optimizer> optimizer)
        {
            if (model == null) throw new ArgumentNullException("model");
            if (optimizer == null) throw new ArgumentNullException("optimizer");
            this.model = model;
            this.optimizer = optimizer;
        }

        /// <summary>A target over one fixed pair.</summary>
        public TorchSharpTarget(nn.Module model, optim.Optimizer optimizer) : this(() => model, () => optimizer) { }

        nn.Module Model {
            get {
                nn.Module m = model();
                if (m == null) throw new InvalidOperationException("the probe target has no model (it returned null)");
                return m;
            }
        }

        optim.Optimizer Optimizer {
            get {
                optim.Optimizer o = optimizer();
                if (o == null) throw new InvalidOperationException("the probe target has no optimizer (it returned null)");
                return GuardedOptimizer.Unwrap(o);
            }
        }

        /// <summary>True for libtorch's native optimizers (LBFGS): a live native handle on Optimizer, or, where
        /// the field cannot be found, any optimizer that is not an OptimizerHelper.</summary>
        public static bool IsNative(optim.Optimizer o)
        {
            if (o is OptimizerHelper) return false;
            if (NativeHandleField == null) return true;
            var h = NativeHandleField.GetValue(o) as SafeHandle;
            return h != null && !h.IsInvalid;
        }

        IList<IParameterView> IProbeTarget.ModelParameters()
        {
            var list = new List<IParameterView>();
            // Item1/Item2, not the tuple names: a TorchSharp built by mcs (the tests' stub) carries none
            foreach (var np in Model.named_parameters()) list.Add(new TsParameterView(np.Item1, np.Item2));
            return list;
        }

        IList<IParamGroupView> IProbeTarget.ParamGroups()
        {
            optim.Optimizer o = Optimizer;
            bool members = !IsNative(o);
            var list = new List<IParamGroupView>();
            foreach (var g in o.ParamGroups) {
                ParamGroup pg = g as ParamGroup;
                if (pg != null) list.Add(new TsGroupView(pg, members));
            }
            return list;
        }

        /// <summary>The live optimizer when it keeps its state in OptimizerHelper._state; null otherwise (a native
        /// optimizer: its state lives in libtorch, not readable, Notes says so).</summary>
        object IProbeTarget.StateOwner {
            get {
                optim.Optimizer o = optimizer();
                o = o == null ? null : GuardedOptimizer.Unwrap(o);
                return o is OptimizerHelper ? o : null;
            }
        }
        string IProbeTarget.StateFieldName { get { return "_state"; } }

        /// <summary>What cannot be read from this optimizer, for the snapshot's notes.</summary>
        IList<string> IProbeNotes.Notes {
            get {
                optim.Optimizer o = optimizer();
                o = o == null ? null : GuardedOptimizer.Unwrap(o);
                if (o == null || !IsNative(o)) return null;
                return new[] {
                    "optimizer state not readable: " + o.GetType().FullName + " is libtorch's native optimizer (not an " +
                    "OptimizerHelper); its state lives in libtorch, and its members are not enumerated (each enumeration " +
                    "wraps the optimizer's own native tensors in new Parameters that free them when finalized); nothing is " +
                    "judged from what was not read" };
            }
        }

        /// <summary>Any optimizer's state entry: its public long "step" field and every public Tensor field
        /// (AdamW: exp_avg, exp_avg_sq, max_exp_avg_sq; SGD: momentum_buffer; ...), null or disposed ones skipped.</summary>
        StateView IProbeTarget.DescribeState(object key, object value)
        {
            if (value == null) return null;
            var sv = new StateView();
            foreach (FieldInfo f in StateFields(value.GetType())) {
                object v = f.GetValue(value);
                if (f.Name == "step" && (v is long || v is int)) { sv.Step = Convert.ToInt64(v); continue; }
                AddTensor(sv, f.Name, v as Tensor);
            }
            return sv;
        }

        static readonly Dictionary<Type, FieldInfo[]> stateFields = new Dictionary<Type, FieldInfo[]>();

        static FieldInfo[] StateFields(Type t)
        {
            lock (stateFields) {
                FieldInfo[] fs;
                if (!stateFields.TryGetValue(t, out fs)) {
                    var l = new List<FieldInfo>();
                    foreach (FieldInfo f in t.GetFields(BindingFlags.Public | BindingFlags.Instance))
                        if (typeof(Tensor).IsAssignableFrom(f.FieldType) || (f.Name == "step" && (f.FieldType == typeof(long) || f.FieldType == typeof(int))))
                            l.Add(f);
                    stateFields[t] = fs = l.ToArray();
                }
                return fs;
            }
        }

        static void AddTensor(StateView sv, string name, Tensor t)
        {
            if (ReferenceEquals(t, null) || t.IsInvalid) return;
            sv.Add(name, t.shape, TensorFacts.DType(t));
        }

        /// <summary>The optimizer's class name, e.g. "AdamW" (a GuardedOptimizer is read through).</summary>
        public string OptimizerType { get { return Optimizer.GetType().Name; } }
        long IProbeTarget.LiveTensors { get { return Tensor.TotalCount; } }
        long IProbeTarget.PeakTensors { get { return Tensor.PeakCount; } }
        long IDisposeScopeStatistics.TensorsCreatedOutsideScope { get { return ScopeStatistics.CreatedOutsideScope; } }
        long IDisposeScopeStatistics.TensorsDisposedOutsideScope { get { return ScopeStatistics.DisposedOutsideScope; } }
        long IDisposeScopeStatistics.TensorsDetachedFromScope { get { return ScopeStatistics.DetachedFromScope; } }
        long IDisposeScopeStatistics.TensorsAttachedToScope { get { return ScopeStatistics.AttachedToScope; } }
    }
}
