// The TorchSharp adapter of the probe contract (dotnet/Probe/Interfaces.cs): what the probe core
// reads from a TorchSharp model and optimizer.
//
// - Parameters come from Module.named_parameters(): the registered Parameter objects, stable
//   across calls. Never through Linear.weight / Embedding.weight: on 0.99.6 those getters wrap
//   the native tensor anew on every read, a new Handle each time (DESIGN.md §6; NN/Linear.cs).
// - Handle = Tensor.Handle, the key AdamW keeps its state under (_state[p.Handle] in
//   AdamW.add_param_group, _state[param.handle] in AdamW.step).
// - DataPtr = LibTorchSharp's THSTensor_data(handle) (src/Native/LibTorchSharp/THSTensor.cpp,
//   `tensor->data_ptr()`), the same native export TorchSharp's own Tensor.bytes uses; TorchSharp
//   declares it internal, so it is imported here. 0 when the native library cannot be reached.
// - The grad is read through whatever this TorchSharp has: a method grad() up to 0.102.5, a
//   property grad from 0.102.6 (Tensor.cs), bound once by reflection, so one source builds for both.
// - Optimizer state: `protected OrderedDict<IntPtr, OptimizerState> _state` on
//   TorchSharp.Modules.OptimizerHelper (Optimizers/Optimizer.cs, unchanged 0.99.6..0.107), read
//   by reflection and handed to the probe through StateHolder, which the trainer rebinds when it
//   rebuilds the optimizer (resume), so the probe always reads the live optimizer.
using System;
using System.Collections.Generic;
using System.Reflection;
using System.Runtime.InteropServices;
using OptCheck.Probe;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OptCheck.Worker
{
    /// <summary>Reads of tensor facts TorchSharp does not expose the same way in every version.</summary>
    public static class TensorFacts
    {
        [DllImport("LibTorchSharp", EntryPoint = "THSTensor_data")]
        static extern IntPtr THSTensor_data(IntPtr handle);

        static bool dataPtrBroken;
        static readonly Func<Tensor, Tensor> gradGetter = BindGrad();

        /// <summary>Why DataPtr returns 0, or null when it works.</summary>
        public static string DataPtrProblem;

        /// <summary>Address of the tensor's data (THSTensor_data); 0 = unknown or no data.</summary>
        public static long DataPtr(Tensor t)
        {
            if (dataPtrBroken || t == null || t.IsInvalid) return 0;
            try {
                long p = THSTensor_data(t.Handle).ToInt64();
                if (p == 0) torch.CheckForErrors();  // clear LibTorchSharp's last error, if it set one
                return p;
            } catch (DllNotFoundException e) {
                dataPtrBroken = true; DataPtrProblem = "THSTensor_data: " + e.Message;
            } catch (EntryPointNotFoundException e) {
                dataPtrBroken = true; DataPtrProblem = "THSTensor_data: " + e.Message;
            } catch (Exception) {
                // an error LibTorchSharp reported for this tensor: unknown for this one only
            }
            return 0;
        }

        static Func<Tensor, Tensor> BindGrad()
        {
            MethodInfo m = typeof(Tensor).GetMethod("grad", BindingFlags.Public | BindingFlags.Instance, null, Type.EmptyTypes, null);
            if (m == null) {
                PropertyInfo p = typeof(Tensor).GetProperty("grad", BindingFlags.Public | BindingFlags.Instance);
                m = p == null ? null : p.GetGetMethod();
            }
            if (m == null) throw new MissingMemberException("TorchSharp.torch+Tensor", "grad (neither a method nor a property)");
            return (Func<Tensor, Tensor>)Delegate.CreateDelegate(typeof(Func<Tensor, Tensor>), null, m);
        }

        /// <summary>The tensor's .grad as a new wrapper (dispose it), or null.</summary>
        public static Tensor Grad(Tensor t)
        {
            return gradGetter(t);
        }

        public static string DType(Tensor t)
        {
            return DTypes.Normalize(t.dtype.ToString());
        }

        public static string Device(Tensor t)
        {
            return t.device_type == DeviceType.CUDA ? "cuda:" + t.device_index : t.device_type.ToString().ToLowerInvariant();
        }
    }

    /// <summary>One Parameter as the probe sees it. Facts are read when asked (the pre-step
    /// fingerprint asks only Handle and DataPtr).</summary>
    public sealed class TsParameterView : IParameterView
    {
        readonly Parameter p;
        readonly string name;

        public TsParameterView(string name, Parameter p)
        {
            this.name = name;
            this.p = p;
        }

        bool Alive { get { return p != null && !p.IsInvalid; } }

        public string Name { get { return name; } }
        public long Handle { get { return Alive ? p.Handle.ToInt64() : 0; } }
        public long DataPtr { get { return Alive ? TensorFacts.DataPtr(p) : 0; } }
        public bool IsLeaf { get { return Alive && p.is_leaf; } }
        public bool RequiresGrad { get { return Alive && p.requires_grad; } }
        public long[] Shape { get { return Alive ? p.shape : new long[0]; } }
        public string DType { get { return Alive ? TensorFacts.DType(p) : "disposed"; } }
        public string Device { get { return Alive ? TensorFacts.Device(p) : "none"; } }

        public bool HasGrad {
            get {
                if (!Alive) return false;
                Tensor g = TensorFacts.Grad(p);
                if (g == null) return false;
                g.Dispose();
                return true;
            }
        }

        public double GradNorm()
        {
            if (!Alive) return double.NaN;
            using (torch.no_grad())
            using (DisposeScope scope = torch.NewDisposeScope()) {
                Tensor g = TensorFacts.Grad(p);
                if (g == null) return double.NaN;
                return g.norm().to(ScalarType.Float64).item<double>();
            }
        }
    }

    /// <summary>One AdamW param group: its options and the tensors step() will walk.</summary>
    public sealed class TsGroupView : IParamGroupView
    {
        static readonly string[] Names = { "lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize" };
        readonly ParamGroup group;

        public TsGroupView(ParamGroup group)
        {
            this.group = group;
        }

        public string[] OptionNames { get { return Names; } }

        public double[] OptionValues {
            get {
                AdamW.Options o = group.Options as AdamW.Options;
                if (o == null) return new double[] { group.LearningRate };
                return new double[] {
                    o.LearningRate ?? double.NaN, o.beta1 ?? double.NaN, o.beta2 ?? double.NaN, o.eps ?? double.NaN,
                    o.weight_decay ?? double.NaN, (o.amsgrad ?? false) ? 1 : 0, (o.maximize ?? false) ? 1 : 0 };
            }
        }

        /// <summary>group.Parameters enumerated afresh: a lazy enumerable re-walks the model, as step() does.</summary>
        public IList<IParameterView> Members()
        {
            var list = new List<IParameterView>();
            foreach (Parameter p in group.Parameters) list.Add(new TsParameterView(null, p));
            return list;
        }
    }

    /// <summary>Holds the live optimizer's _state dictionary for the probe's StateReader (field "state").</summary>
    public sealed class StateHolder
    {
        public object state;
    }

    /// <summary>The training thread's DisposeScope bookkeeping: TorchSharp's public static
    /// DisposeScopeManager.Statistics (a [ThreadStatic] ThreadDisposeScopeStatistics, in
    /// src/TorchSharp/DisposeScopeManager.cs), CreatedOutsideScopeCount and DisposedOutsideScopeCount.
    /// Bound by reflection once, so one source builds on every TorchSharp (0.107.0 has them; the
    /// 0.99 stub declares no DisposeScopeManager); -1 where this TorchSharp has no such members.</summary>
    public static class ScopeStatistics
    {
        static readonly PropertyInfo Stats = Bind("TorchSharp.DisposeScopeManager", "Statistics", true);
        static readonly PropertyInfo Created = Member("CreatedOutsideScopeCount");
        static readonly PropertyInfo Disposed = Member("DisposedOutsideScopeCount");

        static PropertyInfo Bind(string type, string name, bool isStatic)
        {
            Type t = typeof(torch).Assembly.GetType(type, false);
            if (t == null) return null;
            return t.GetProperty(name, BindingFlags.Public | (isStatic ? BindingFlags.Static : BindingFlags.Instance));
        }

        static PropertyInfo Member(string name)
        {
            if (Stats == null) return null;
            PropertyInfo p = Stats.PropertyType.GetProperty(name, BindingFlags.Public | BindingFlags.Instance);
            return p != null && p.PropertyType == typeof(long) ? p : null;
        }

        static long Read(PropertyInfo p)
        {
            if (p == null) return -1;
            try {
                object stats = Stats.GetValue(null, null);
                return stats == null ? -1 : (long)p.GetValue(stats, null);
            } catch (Exception) {
                return -1;
            }
        }

        public static long CreatedOutsideScope { get { return Read(Created); } }
        public static long DisposedOutsideScope { get { return Read(Disposed); } }
    }

    /// <summary>IProbeTarget over a GptTrainer's current model and optimizer.</summary>
    public sealed class TorchSharpTarget : IProbeTarget, IDisposeScopeStatistics
    {
        /// <summary>OptimizerHelper._state, or null when this TorchSharp has no such field.</summary>
        public static readonly FieldInfo StateField =
            typeof(OptimizerHelper).GetField("_state", BindingFlags.Instance | BindingFlags.NonPublic | BindingFlags.Public);

        readonly GptTrainer trainer;
        readonly StateHolder holder = new StateHolder();

        public TorchSharpTarget(GptTrainer trainer)
        {
            this.trainer = trainer;
        }

        /// <summary>Point the probe at this optimizer's state (called whenever the optimizer is built).</summary>
        public void Bind(OptimizerHelper optimizer)
        {
            holder.state = StateField == null || optimizer == null ? null : StateField.GetValue(optimizer);
        }

        public IList<IParameterView> ModelParameters()
        {
            var list = new List<IParameterView>();
            foreach (var np in trainer.Model.named_parameters()) list.Add(new TsParameterView(np.name, np.parameter));
            return list;
        }

        public IList<IParamGroupView> ParamGroups()
        {
            var list = new List<IParamGroupView>();
            foreach (var g in trainer.Optimizer.ParamGroups) {
                ParamGroup pg = g as ParamGroup;
                if (pg != null) list.Add(new TsGroupView(pg));
            }
            return list;
        }

        // With the field found, the probe reads holder.state; without it, it looks for "_state" on the
        // optimizer itself and its snapshot says why the state cannot be read.
        public object StateOwner { get { return StateField != null ? (object)holder : trainer.Optimizer; } }
        public string StateFieldName { get { return StateField != null ? "state" : "_state"; } }

        public StateView DescribeState(object key, object value)
        {
            AdamW.State s = value as AdamW.State;
            if (s == null) return null;
            var sv = new StateView();
            sv.Step = s.step;
            AddTensor(sv, "exp_avg", s.exp_avg);
            AddTensor(sv, "exp_avg_sq", s.exp_avg_sq);
            AddTensor(sv, "max_exp_avg_sq", s.max_exp_avg_sq);
            return sv;
        }

        static void AddTensor(StateView sv, string name, Tensor t)
        {
            if (t == null || t.IsInvalid) return;
            sv.Add(name, t.shape, TensorFacts.DType(t));
        }

        public string OptimizerType { get { return trainer.Optimizer.GetType().Name; } }
        public long LiveTensors { get { return Tensor.TotalCount; } }
        public long PeakTensors { get { return Tensor.PeakCount; } }
        public long TensorsCreatedOutsideScope { get { return ScopeStatistics.CreatedOutsideScope; } }
        public long TensorsDisposedOutsideScope { get { return ScopeStatistics.DisposedOutsideScope; } }
    }
}
