// The TorchSharp adapter of the probe contract (dotnet/Probe/Interfaces.cs): what the probe core
// reads from a TorchSharp model and optimizer.
//
// - Parameters come from Module.named_parameters(): the registered Parameter objects, stable
//   across calls. Never through Linear.weight / Embedding.weight: on 0.99.6 those getters wrap
//   the native tensor anew on every read, a new Handle each time (docs/torchsharp.md; NN/Linear.cs).
// - Handle = Tensor.Handle, the key AdamW keeps its state under (_state[p.Handle] in
//   AdamW.add_param_group, _state[param.handle] in AdamW.step).
// - DataPtr = LibTorchSharp's THSTensor_data(handle) (src/Native/LibTorchSharp/THSTensor.cpp,
//   `tensor->data_ptr()`), the same native export TorchSharp's own Tensor.bytes uses; TorchSharp
//   declares it internal, so it is imported here. 0 when the native library cannot be reached.
// - The grad is read through whatever this TorchSharp has: a method grad() up to 0.102.5, a
//   property grad from 0.102.6 (Tensor.cs), bound once by reflection, so one source builds for both.
// - Optimizer state: `protected OrderedDict<IntPtr, OptimizerState> _state` on
//   TorchSharp.Modules.OptimizerHelper (Optimizers/Optimizer.cs, unchanged 0.99.6..0.107): the
//   probe reads it by reflection from the live optimizer (StateOwner, re-read on every call, so a
//   rebuilt optimizer is followed).
// - A native optimizer (libtorch's, behind Optimizer's handle: LBFGS) is read for its groups' options
//   only. Its ParamGroup.Parameters is Optimizer.parameters(), which wraps every native tensor the
//   optimizer holds in a new Parameter on each enumeration; those wrappers free native memory when
//   they are finalized, and a run under the probe died of "double free or corruption" (run on
//   0.107.0, docs/torchsharp.md). The probe never enumerates them: members and state are reported
//   as not readable, and nothing is judged from them.
using System;
using System.Collections.Generic;
using System.Reflection;
using System.Runtime.InteropServices;
using OptCheck.Contract;
using OptCheck.Probe;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OptCheck.Worker
{
    /// <summary>Reads of tensor facts TorchSharp does not expose the same way in every version.</summary>
    internal static class TensorFacts
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
            if (dataPtrBroken || ReferenceEquals(t, null) || t.IsInvalid) return 0;
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

        /// <summary>TorchSharp's package version, from its assembly (informational version without the +commit).</summary>
        public static string TorchSharpVersion()
        {
            Assembly a = typeof(torch).Assembly;
            var info = (AssemblyInformationalVersionAttribute)Attribute.GetCustomAttribute(a, typeof(AssemblyInformationalVersionAttribute));
            string v = info != null ? info.InformationalVersion : a.GetName().Version.ToString();
            int plus = v.IndexOf('+');
            return plus >= 0 ? v.Substring(0, plus) : v;
        }

        public static string Device(Tensor t)
        {
            return t.device_type == DeviceType.CUDA ? "cuda:" + t.device_index : t.device_type.ToString().ToLowerInvariant();
        }
    }

    /// <summary>One Parameter as the probe sees it. Facts are read when asked (the pre-step
    /// fingerprint asks only Handle and DataPtr).</summary>
    internal sealed class TsParameterView : IParameterView, IParameterValues
    {
        readonly Parameter p;
        readonly string name;

        public TsParameterView(string name, Parameter p)
        {
            this.name = name;
            this.p = p;
        }

        bool Alive { get { return !ReferenceEquals(p, null) && !p.IsInvalid; } }

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
                if (ReferenceEquals(g, null)) return false;
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
                if (ReferenceEquals(g, null)) return double.NaN;
                return g.norm().to(ScalarType.Float64).item<double>();
            }
        }

        /// <summary>value_norm and checksum. A contiguous CPU float32/float64 tensor is read once from its
        /// data (THSTensor_data) by ValueStats, both figures in that one pass; other 4-byte-word tensors get
        /// their checksum from the words and their norm from TorchSharp; elsewhere (CUDA, an odd number of
        /// 16-bit values, non-contiguous) only the norm, from TorchSharp in float32 (as optcheck/pytorch/probe.py).</summary>
        public bool ReadValues(out double valueNorm, out long checksum)
        {
            valueNorm = double.NaN;
            checksum = 0;
            if (!Alive) return false;
            bool haveSum = false;
            long n = p.numel(), size = p.element_size();
            if (p.device_type == DeviceType.CPU && p.is_contiguous()) {
                long ptr = TensorFacts.DataPtr(p);
                if (ptr != 0) {
                    string dt = TensorFacts.DType(p);
                    if (dt == "float32") { ValueStats.Float32(new IntPtr(ptr), n, out valueNorm, out checksum); return true; }
                    if (dt == "float64") { ValueStats.Float64(new IntPtr(ptr), n, out valueNorm, out checksum); return true; }
                    if (size <= 4 && (n * size) % 4 == 0) { checksum = ValueStats.Words32(new IntPtr(ptr), n * size); haveSum = true; }
                }
            }
            using (torch.no_grad())
            using (DisposeScope scope = torch.NewDisposeScope()) {
                valueNorm = p.detach().to(ScalarType.Float32).norm().to(ScalarType.Float64).item<double>();
            }
            return haveSum;
        }
    }

    /// <summary>One param group of any TorchSharp optimizer: its options and the tensors step() will walk.</summary>
    internal sealed class TsGroupView : IParamGroupView
    {
        readonly ParamGroup group;
        readonly OptionReader options;
        readonly bool readMembers;

        /// <param name="group">the group</param>
        /// <param name="readMembers">false for a native optimizer's group: Members() returns null (not readable)
        /// and never enumerates group.Parameters</param>
        public TsGroupView(ParamGroup group, bool readMembers)
        {
            this.group = group;
            this.readMembers = readMembers;
            options = OptionReader.For(group.Options == null ? null : group.Options.GetType());
        }

        public string[] OptionNames { get { return options.Names; } }

        /// <summary>"lr" from the group's LearningRate (what a schedule sets), then every option of the
        /// optimizer's Options class (AdamW: beta1, beta2, weight_decay, eps, amsgrad, maximize; SGD:
        /// momentum, dampening, ...): NaN for an option left null, 1/0 for a bool.</summary>
        public double[] OptionValues { get { return options.Values(group); } }

        /// <summary>group.Parameters enumerated afresh: a lazy enumerable re-walks the model, as step() does;
        /// null (not readable) for a native optimizer's group.</summary>
        public IList<IParameterView> Members()
        {
            if (!readMembers) return null;
            var list = new List<IParameterView>();
            foreach (Parameter p in group.Parameters) list.Add(new TsParameterView(null, p));
            return list;
        }
    }

    /// <summary>The options of one OptimizerOptions subclass, found once by reflection: its public
    /// instance fields and properties of type double?, double, float?, bool?, bool, int?, long? (every
    /// built-in optimizer's Options holds only such fields, src/TorchSharp/Optimizers/*.cs).</summary>
    internal sealed class OptionReader
    {
        static readonly Dictionary<Type, OptionReader> cache = new Dictionary<Type, OptionReader>();
        readonly List<Func<object, double>> getters = new List<Func<object, double>>();
        public readonly string[] Names;

        OptionReader(Type t)
        {
            var names = new List<string> { "lr" };
            if (t != null) {
                foreach (FieldInfo f in t.GetFields(BindingFlags.Public | BindingFlags.Instance)) {
                    FieldInfo fi = f;
                    if (Numeric(f.FieldType)) { names.Add(f.Name); getters.Add(o => ToDouble(fi.GetValue(o))); }
                }
                foreach (PropertyInfo pr in t.GetProperties(BindingFlags.Public | BindingFlags.Instance)) {
                    PropertyInfo pi = pr;
                    if (pr.Name == "LearningRate" || pr.Name == "InitialLearningRate" || !pr.CanRead ||
                        pr.GetIndexParameters().Length != 0 || !Numeric(pr.PropertyType)) continue;
                    names.Add(pr.Name); getters.Add(o => ToDouble(pi.GetValue(o, null)));
                }
            }
            Names = names.ToArray();
        }

        public static OptionReader For(Type optionsType)
        {
            lock (cache) {
                OptionReader r;
                Type key = optionsType ?? typeof(void);
                if (!cache.TryGetValue(key, out r)) cache[key] = r = new OptionReader(optionsType);
                return r;
            }
        }

        static bool Numeric(Type t)
        {
            Type u = Nullable.GetUnderlyingType(t) ?? t;
            return u == typeof(double) || u == typeof(float) || u == typeof(bool) || u == typeof(int) || u == typeof(long);
        }

        static double ToDouble(object v)
        {
            if (v == null) return double.NaN;
            if (v is bool) return (bool)v ? 1 : 0;
            return Convert.ToDouble(v, System.Globalization.CultureInfo.InvariantCulture);
        }

        public double[] Values(ParamGroup group)
        {
            var r = new double[Names.Length];
            r[0] = group.LearningRate;
            for (int i = 0; i < getters.Count; i++) r[i + 1] = group.Options == null ? double.NaN : getters[i](group.Options);
            return r;
        }
    }

    /// <summary>The training thread's DisposeScope bookkeeping: TorchSharp's public static
    /// DisposeScopeManager.Statistics (a [ThreadStatic] ThreadDisposeScopeStatistics, in
    /// src/TorchSharp/DisposeScopeManager.cs), CreatedOutsideScopeCount, DisposedOutsideScopeCount, DetachedFromScopeCount
    /// and AttachedToScopeCount.
    /// Bound by reflection once, so one source builds on every TorchSharp (0.107.0 has them; the
    /// 0.99 stub declares no DisposeScopeManager); -1 where this TorchSharp has no such members.</summary>
    internal static class ScopeStatistics
    {
        static readonly PropertyInfo Stats = Bind("TorchSharp.DisposeScopeManager", "Statistics", true);
        static readonly PropertyInfo Created = Member("CreatedOutsideScopeCount");
        static readonly PropertyInfo Disposed = Member("DisposedOutsideScopeCount");
        static readonly PropertyInfo Detached = Member("DetachedFromScopeCount");
        static readonly PropertyInfo Attached = Member("AttachedToScopeCount");   // 0.103 on (TorchSharp #1390)

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
        public static long DetachedFromScope { get { return Read(Detached); } }
        public static long AttachedToScope { get { return Read(Attached); } }
    }
}
