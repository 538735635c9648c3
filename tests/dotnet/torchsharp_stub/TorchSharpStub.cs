// A SIGNATURE CHECK, NOT AN IMPLEMENTATION.
//
// TorchSharp cannot be restored on this machine (no .NET SDK, no NuGet), so
// tests/unit/test_torchsharp_worker_sources.py compiles dotnet/Worker/*.cs with Debian's `mcs`
// against this file instead. It declares exactly the TorchSharp members dotnet/Worker uses, with
// the signatures (names, parameter types, defaults, overload sets that decide overload resolution,
// implicit conversions) read in github dotnet/TorchSharp at tag v0.99.6, each checked to exist
// with a compatible signature at 0.107 (main, version 0.107.0) too; where they differ it says so.
// A typo or a member that does not exist in TorchSharp then fails the test here. Every body
// throws: nothing here runs. Files cited are under src/TorchSharp/ at v0.99.6.
using System;
using System.Collections;
using System.Collections.Generic;

namespace TorchSharp
{
    public enum DeviceType { CPU = 0, CUDA = 1 }                                  // Torch.cs

    public sealed class Scalar : IDisposable                                      // Scalar.cs
    {
        Scalar() { }
        public void Dispose() { }
        public static implicit operator Scalar(byte value) { throw null; }
        public static implicit operator Scalar(sbyte value) { throw null; }
        public static implicit operator Scalar(short value) { throw null; }
        public static implicit operator Scalar(int value) { throw null; }
        public static implicit operator Scalar(long value) { throw null; }
        public static implicit operator Scalar(float value) { throw null; }
        public static implicit operator Scalar(double value) { throw null; }
        public static implicit operator Scalar(bool value) { throw null; }
    }

    public class DisposeScope : IDisposable                                        // DisposeScope.cs
    {
        public void Dispose() { }
    }

    public static class ModuleExtensionMethods                                     // NN/Module.cs (0.107: + bool non_blocking = false)
    {
        public static T to<T>(this T module, torch.ScalarType type) where T : torch.nn.Module { throw null; }
        public static T to<T>(this T module, torch.Device device, torch.ScalarType type) where T : torch.nn.Module { throw null; }
        public static T to<T>(this T module, DeviceType deviceType, int deviceIndex = -1) where T : torch.nn.Module { throw null; }
        public static T to<T>(this T module, torch.Device device) where T : torch.nn.Module { throw null; }
        public static T to<T>(this T module, string device) where T : torch.nn.Module { throw null; }
    }

    public static partial class torch
    {
        public enum ScalarType : sbyte                                             // Tensor/Tensor.cs
        {
            Byte = 0, Int8 = 1, Int16 = 2, Int32 = 3, Int64 = 4, Float16 = 5, Float32 = 6, Float64 = 7,
            ComplexFloat32 = 9, ComplexFloat64 = 10, Bool = 11, BFloat16 = 15
        }

        public class Device                                                        // Device.cs
        {
            public Device(string description) { }
            public DeviceType type { get { throw null; } }
            public int index { get { throw null; } }
        }

        public static Device CPU;

        public class Generator : IDisposable { public void Dispose() { } }        // Generator.cs

        public partial class Tensor : IDisposable                                  // Tensor/Tensor.cs
        {
            public void Dispose() { }
            public bool IsInvalid { get { throw null; } }
            public IntPtr Handle { get { throw null; } }
            public static long TotalCount { get { throw null; } }
            public static long PeakCount { get { throw null; } }
            public Tensor MoveToOuterDisposeScope() { throw null; }                 // Tensor.cs (DisposeScope, 0.97+)
            public bool is_leaf { get { throw null; } }
            public bool requires_grad { get { throw null; } set { } }
            public long[] shape { get { throw null; } }
            public ScalarType dtype { get { throw null; } }
            public Device device { get { throw null; } }
            public DeviceType device_type { get { throw null; } }
            public int device_index { get { throw null; } }
            public long dim() { throw null; }
            // grad: a method up to 0.102.5, a property from 0.102.6 — dotnet/Worker binds it by reflection
            // (TensorFacts.BindGrad), so neither form is declared here.
            public Tensor view(params long[] shape) { throw null; }
            public Tensor reshape(params long[] shape) { throw null; }
            public Tensor transpose(long dim0, long dim1) { throw null; }
            public Tensor[] split(long size, int dim = 0) { throw null; }
            public Tensor[] split(long[] sizes, long dim = 0) { throw null; }
            public Tensor[] split(params long[] sizes) { throw null; }
            public Tensor contiguous() { throw null; }
            public Tensor matmul(Tensor target) { throw null; }
            public Tensor add(Tensor target) { throw null; }
            public Tensor add(Tensor target, Scalar alpha) { throw null; }
            public Tensor add(Scalar scalar) { throw null; }
            public Tensor mul(Tensor target) { throw null; }
            public Tensor mul(Scalar target) { throw null; }
            public Tensor masked_fill(Tensor mask, Scalar value) { throw null; }
            public Tensor tril(long diagonal = 0) { throw null; }
            public Tensor triu(long diagonal = 0) { throw null; }
            public Tensor norm(float p = 2.0f) { throw null; }
            public Tensor norm(int dim, bool keepdim = false, float p = 2.0f) { throw null; }
            public Tensor detach() { throw null; }
            public long numel() { throw null; }                                      // Tensor/Tensor.cs (0.99.6 and 0.107)
            public long element_size() { throw null; }
            public bool is_contiguous() { throw null; }
            public Tensor clone() { throw null; }
            public Tensor copy_(Tensor source, bool nonBlocking = false) { throw null; }
            public Tensor to(ScalarType type) { throw null; }                        // 0.107: + copy, disposeAfter, non_blocking defaults
            public Tensor to(ScalarType type, Device device, bool copy = false) { throw null; }
            public Tensor to(DeviceType deviceType, int deviceIndex = -1, bool copy = false) { throw null; }
            public Tensor to(Device device) { throw null; }
            public Tensor to(Tensor other) { throw null; }
            public T item<T>() where T : struct { throw null; }                    // TorchSharp: where T : unmanaged (C# 7.3)
            public void backward() { }
            public void backward(IList<Tensor> grad_tensors = null, bool create_graph = false, bool retain_graph = false, IList<Tensor> inputs = null) { }
            // every implicit conversion Tensor.cs declares except the complex / TensorIndex ones. Scalar ->
            // Tensor makes Scalar the better conversion target, so mul(double) picks mul(Scalar): not ambiguous.
            public static implicit operator Tensor(byte value) { throw null; }
            public static implicit operator Tensor(sbyte value) { throw null; }
            public static implicit operator Tensor(short value) { throw null; }
            public static implicit operator Tensor(int value) { throw null; }
            public static implicit operator Tensor(long value) { throw null; }
            public static implicit operator Tensor(float value) { throw null; }
            public static implicit operator Tensor(double value) { throw null; }
            public static implicit operator Tensor(bool value) { throw null; }
            public static implicit operator Tensor(byte[] value) { throw null; }
            public static implicit operator Tensor(sbyte[] value) { throw null; }
            public static implicit operator Tensor(short[] value) { throw null; }
            public static implicit operator Tensor(int[] value) { throw null; }
            public static implicit operator Tensor(long[] value) { throw null; }
            public static implicit operator Tensor(float[] value) { throw null; }
            public static implicit operator Tensor(double[] value) { throw null; }
            public static implicit operator Tensor(bool[] value) { throw null; }
            public static implicit operator Tensor(Scalar scalar) { throw null; }
            // Element-wise comparison and logical operators, as 0.107.0 declares them (Tensor/Tensor.Operators.cs):
            // `t == null` is then a Tensor, not a bool (CS0266), and `t != null && ...` needs operator
            // true/false (CS0218). Null checks are written ReferenceEquals(t, null), which means the same on
            // 0.99.6, where these operators did not exist yet.
            public static Tensor operator ==(Tensor left, Tensor right) { throw null; }
            public static Tensor operator ==(Tensor left, Scalar right) { throw null; }
            public static Tensor operator ==(Scalar left, Tensor right) { throw null; }
            public static Tensor operator !=(Tensor left, Tensor right) { throw null; }
            public static Tensor operator !=(Tensor left, Scalar right) { throw null; }
            public static Tensor operator !=(Scalar left, Tensor right) { throw null; }
            public static Tensor operator &(Tensor left, Tensor right) { throw null; }
            public static Tensor operator |(Tensor left, Tensor right) { throw null; }
            public static Tensor operator ^(Tensor left, Tensor right) { throw null; }
            public static Tensor operator ~(Tensor left) { throw null; }
            public static Tensor operator *(Tensor left, Tensor right) { throw null; }      // Tensor/Tensor.Operators.cs (tests/dotnet/instep)
            // and the explicit conversions to scalars (so the compiler says CS0266 "an explicit conversion exists")
            public static explicit operator float(Tensor value) { throw null; }
            public static explicit operator double(Tensor value) { throw null; }
            public static explicit operator sbyte(Tensor value) { throw null; }
            public static explicit operator byte(Tensor value) { throw null; }
            public static explicit operator short(Tensor value) { throw null; }
            public static explicit operator int(Tensor value) { throw null; }
            public static explicit operator long(Tensor value) { throw null; }
            public static explicit operator bool(Tensor value) { throw null; }
            public override bool Equals(object obj) { throw null; }
            public override int GetHashCode() { throw null; }
        }

        // Tensor/Factories/*.cs (0.99.6: Tensor/torch.*.cs)
        public static Tensor ones(long[] size, ScalarType? dtype = null, Device device = null, bool requires_grad = false, string[] names = null) { throw null; }
        public static Tensor ones(long size, ScalarType? dtype = null, Device device = null, bool requires_grad = false, string[] names = null) { throw null; }
        public static Tensor ones(long rows, long columns, ScalarType? dtype = null, Device device = null, bool requires_grad = false, string[] names = null) { throw null; }
        public static Tensor zeros(long[] size, ScalarType? dtype = null, Device device = null, bool requires_grad = false, string[] names = null) { throw null; }
        public static Tensor zeros(long size, ScalarType? dtype = null, Device device = null, bool requires_grad = false, string[] names = null) { throw null; }
        public static Tensor arange(Scalar start, Scalar stop, Scalar step, ScalarType? dtype = null, Device device = null, bool requires_grad = false) { throw null; }
        public static Tensor arange(Scalar start, Scalar stop, ScalarType? dtype = null, Device device = null, bool requires_grad = false) { throw null; }
        public static Tensor arange(Scalar stop, ScalarType? dtype = null, Device device = null, bool requires_grad = false) { throw null; }
        public static Tensor tensor(long scalar, ScalarType? dtype = null, Device device = null, bool requires_grad = false) { throw null; }
        public static Tensor tensor(long[] dataArray, ScalarType? dtype = null, Device device = null, bool requires_grad = false, string[] names = null) { throw null; }
        public static Tensor tensor(float[] rawArray, ScalarType? dtype = null, Device device = null, bool requires_grad = false, string[] names = null) { throw null; }
        public static Tensor tensor(double[] rawArray, ScalarType? dtype = null, Device device = null, bool requires_grad = false, string[] names = null) { throw null; }

        public static IDisposable no_grad() { throw null; }                           // Tensor/torch.LocallyDisablingGradientComputation.cs
        public static DisposeScope NewDisposeScope() { throw null; }                  // Tensor/Tensor.cs
        public static Generator manual_seed(long seed) { throw null; }                // Tensor/torch.RandomSampling.cs
        public static int get_num_threads() { throw null; }                           // Tensor/torch.Parallelism.cs
        public static void set_num_threads(int num) { }
        public static void CheckForErrors() { }                                       // Torch.cs
        public static string __version__ { get { throw null; } }                      // Torch.cs (libtorch package version)

        public static partial class nn
        {
            public class Module : IDisposable                                       // NN/Module.cs
            {
                protected Module(string name) { }
                public void Dispose() { }
                protected virtual void Dispose(bool disposing) { }
                public virtual IEnumerable<(string name, TorchSharp.Modules.Parameter parameter)> named_parameters(bool recurse = true) { throw null; }
                public virtual IEnumerable<TorchSharp.Modules.Parameter> parameters(bool recurse = true) { throw null; }
                public virtual TorchSharp.Modules.Parameter get_parameter(string target) { throw null; }
                public virtual void register_parameter(string name, TorchSharp.Modules.Parameter param) { }
                protected virtual void RegisterComponents() { }
                public virtual void train(bool train = true) { }
                public virtual void eval() { }
                public virtual bool training { get { throw null; } }
                public Module save(string location, IList<string> skip = null) { throw null; }
                public virtual Module load(string location, bool strict = true, IList<string> skip = null) { throw null; }
            }

            public abstract class Module<T, TResult> : Module
            {
                protected Module(string name) : base(name) { }
                public abstract TResult forward(T input);
                public TResult call(T input) { throw null; }
            }

            public enum Reduction : long { None = 0, Mean = 1, Sum = 2 }              // NN/Losses.cs

            // NN/Linear.cs, NN/Embedding.cs
            public static TorchSharp.Modules.Linear Linear(long inputSize, long outputSize, bool hasBias = true, Device device = null, ScalarType? dtype = null) { throw null; }
            public static TorchSharp.Modules.Embedding Embedding(long num_embeddings, long embedding_dims, long? padding_idx = null, double? max_norm = null, double norm_type = 2.0, bool scale_grad_by_freq = false, bool sparse = false, Device device = null, ScalarType? dtype = null) { throw null; }

            public static partial class functional
            {
                public static Tensor linear(Tensor input, Tensor weights, Tensor bias = null) { throw null; }                      // NN/Linear.cs
                public static Tensor layer_norm(Tensor input, long[] normalized_shape, Tensor weight = null, Tensor bias = null, double eps = 1e-5) { throw null; }  // NN/Normalization/Functional.cs
                public static Tensor gelu(Tensor x) { throw null; }                                                                  // NN/Activation/GELU.cs
                public static Tensor softmax(Tensor input, long dim, ScalarType? dtype = null) { throw null; }                      // NN/Activation/Softmax.cs
                public static Tensor cross_entropy(Tensor input, Tensor target, Tensor weight = null, long ignore_index = -100, Reduction reduction = Reduction.Mean, double label_smoothing = 0.0) { throw null; }  // NN/Losses.cs
            }

            public static class init                                                   // NN/Init.cs
            {
                public static Tensor normal_(Tensor tensor, double mean = 0, double std = 1, Generator generator = null) { throw null; }
                public static Tensor zeros_(Tensor tensor) { throw null; }
            }

            public static partial class utils                                          // Torch.cs
            {
                public static double clip_grad_norm_(IEnumerable<TorchSharp.Modules.Parameter> tensors, double max_norm, double norm_type = 2.0) { throw null; }
            }
        }

        public static partial class optim                                              // Optimizers/Optimizer.cs, AdamW.cs
        {
            public abstract partial class Optimizer : IDisposable
            {
                protected Optimizer(IntPtr handle) { }                                  // the body sets the native handle when not zero
                public void Dispose() { }
                protected virtual void Dispose(bool disposing) { }
                public virtual IEnumerable<TorchSharp.Modules.Parameter> parameters() { throw null; }
                public virtual void add_param_group(TorchSharp.Modules.ParamGroup param_group) { }
                public virtual void zero_grad() { }
                public virtual Tensor step(Func<Tensor> closure = null) { throw null; }
                public virtual IEnumerable<ILearningRateController> ParamGroups { get { throw null; } }
            }

            public interface ILearningRateController
            {
                double LearningRate { set; get; }
                double InitialLearningRate { set; get; }
            }

            // Optimizers/Optimizer.cs (0.99 through 0.107): what OneCycleLR / CyclicLR ask the optimizer object for
            public interface IMomentum
            {
                double Momentum { get; set; }
            }

            public interface IBetas
            {
                (double, double) Betas { get; set; }
            }

            public static TorchSharp.Modules.AdamW AdamW(IEnumerable<TorchSharp.Modules.Parameter> parameters, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0, bool amsgrad = false, bool maximize = false) { throw null; }
            public static TorchSharp.Modules.AdamW AdamW(IEnumerable<(string name, TorchSharp.Modules.Parameter parameter)> parameters, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0, bool amsgrad = false, bool maximize = false) { throw null; }
            public static TorchSharp.Modules.AdamW AdamW(IEnumerable<TorchSharp.Modules.AdamW.ParamGroup> parameters, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0, bool amsgrad = false, bool maximize = false) { throw null; }
        }
    }
}

namespace TorchSharp.Utils
{
    // Utils/OrderedDict.cs (unchanged to 0.107). The one stub type with working bodies: the probe reads
    // OptimizerHelper._state by reflection, so its interfaces and enumerators are the API that matters.
    // As in TorchSharp, the KeyValuePair enumerator throws, and the non-generic one calls it.
    public class OrderedDict<TKey, TValue> : IDictionary<TKey, TValue>, IList<(TKey, TValue)>
    {
        readonly List<(TKey, TValue)> _list = new List<(TKey, TValue)>();
        readonly Dictionary<TKey, TValue> _dict = new Dictionary<TKey, TValue>();

        public (TKey, TValue) this[int index] { get { return _list[index]; } set { _list[index] = value; _dict[value.Item1] = value.Item2; } }
        public TValue this[TKey key] {
            get { return _dict[key]; }
            set {
                _dict[key] = value;
                int idx = _list.FindIndex(kv => kv.Item1.Equals(key));
                if (idx >= 0) _list[idx] = (key, value); else _list.Add((key, value));
            }
        }
        public bool IsReadOnly { get { return false; } }
        public ICollection<TKey> Keys { get { return _list.ConvertAll(kv => kv.Item1); } }
        public ICollection<TValue> Values { get { return _list.ConvertAll(kv => kv.Item2); } }
        public int Count { get { return _dict.Count; } }
        public void Add(TKey key, TValue value) { _dict.Add(key, value); _list.Add((key, value)); }
        public void Add(KeyValuePair<TKey, TValue> item) { Add(item.Key, item.Value); }
        public void Add((TKey, TValue) item) { Add(item.Item1, item.Item2); }
        public void Clear() { _list.Clear(); _dict.Clear(); }
        public bool Contains(KeyValuePair<TKey, TValue> item) { return _dict.ContainsKey(item.Key); }
        public bool Contains((TKey, TValue) item) { return _dict.ContainsKey(item.Item1); }
        public bool ContainsKey(TKey key) { return _dict.ContainsKey(key); }
        public void CopyTo(KeyValuePair<TKey, TValue>[] array, int arrayIndex) { throw new NotImplementedException(); }
        public void CopyTo((TKey, TValue)[] array, int arrayIndex) { _list.CopyTo(array, arrayIndex); }
        public int IndexOf((TKey, TValue) item) { return _list.IndexOf(item); }
        public void Insert(int index, (TKey, TValue) item) { _dict.Add(item.Item1, item.Item2); _list.Insert(index, item); }
        public bool Remove(TKey key) { _list.RemoveAll(kv => kv.Item1.Equals(key)); return _dict.Remove(key); }
        public bool Remove(KeyValuePair<TKey, TValue> item) { return Remove(item.Key); }
        public bool Remove((TKey, TValue) item) { return Remove(item.Item1); }
        public void RemoveAt(int index) { _dict.Remove(_list[index].Item1); _list.RemoveAt(index); }
        public bool TryGetValue(TKey key, out TValue value) { return _dict.TryGetValue(key, out value); }
        public IEnumerator<(TKey, TValue)> GetEnumerator() { return _list.GetEnumerator(); }
        IEnumerator<KeyValuePair<TKey, TValue>> IEnumerable<KeyValuePair<TKey, TValue>>.GetEnumerator() { throw new NotImplementedException(); }
        IEnumerator IEnumerable.GetEnumerator() { return ((IEnumerable<KeyValuePair<TKey, TValue>>)this).GetEnumerator(); }
    }
}

namespace TorchSharp.Modules
{
    using static TorchSharp.torch;

    public class Parameter : Tensor                                                   // NN/Parameter.cs
    {
        public Parameter(Tensor data, bool requires_grad = true) { }
    }

    public sealed class Linear : nn.Module<Tensor, Tensor>                            // NN/Linear.cs (0.107: managed, getters return the field)
    {
        Linear() : base("Linear") { }
        public override Tensor forward(Tensor tensor) { throw null; }
        public Parameter bias { get { throw null; } set { } }
        public Parameter weight { get { throw null; } set { } }
    }

    public sealed class Embedding : nn.Module<Tensor, Tensor>                         // NN/Embedding.cs
    {
        Embedding() : base("Embedding") { }
        public override Tensor forward(Tensor input) { throw null; }
        public Parameter weight { get { throw null; } set { } }
    }

    public class ModuleList<T> : nn.Module, IEnumerable<T> where T : nn.Module       // NN/ModuleList.cs (also IList<T>)
    {
        public ModuleList(params T[] modules) : base("ModuleList") { }
        public T this[int index] { get { throw null; } set { } }
        public int Count { get { throw null; } }
        public IEnumerator<T> GetEnumerator() { throw null; }
        IEnumerator IEnumerable.GetEnumerator() { throw null; }
    }

    public class OptimizerOptions                                                      // Optimizers/Optimizer.cs
    {
        public double? LearningRate { get; set; }
        public double InitialLearningRate { get; set; }
    }

    public abstract class OptimizerState { }

    public class ParamGroup : optim.ILearningRateController
    {
        public IEnumerable<Parameter> Parameters { get; set; }
        public OptimizerOptions Options { get; set; }
        public double LearningRate { get { throw null; } set { } }
        public double InitialLearningRate { get { throw null; } set { } }
    }

    public class ParamGroup<TOptions> : ParamGroup where TOptions : OptimizerOptions
    {
        public ParamGroup() { }
        public ParamGroup(IEnumerable<Parameter> parameters, TOptions options = null) { }
        public new TOptions Options { get { throw null; } set { } }
    }

    public abstract class OptimizerHelper : optim.Optimizer
    {
        protected OptimizerHelper() : base(IntPtr.Zero) { }
        public void save_state_dict(string location) { }
        public void load_state_dict(string location) { }
        protected Utils.OrderedDict<IntPtr, OptimizerState> _state = new Utils.OrderedDict<IntPtr, OptimizerState>();
    }

    public class AdamW : OptimizerHelper                                               // Optimizers/AdamW.cs
    {
        public AdamW(IEnumerable<ParamGroup> parameters, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0, bool amsgrad = false, bool maximize = false) { }

        public class Options : OptimizerOptions
        {
            public double? beta1;
            public double? beta2;
            public double? weight_decay;
            public double? eps;
            public bool? amsgrad;
            public bool? maximize;
        }

        public class State : OptimizerState                                            // 0.107: sealed, ctor(Parameter)
        {
            public long step;
            public Tensor exp_avg;
            public Tensor exp_avg_sq;
            public Tensor max_exp_avg_sq;
        }

        public class ParamGroup : ParamGroup<Options>
        {
            public ParamGroup() { }
            public ParamGroup(IEnumerable<Parameter> parameters, Options options) { }
            public ParamGroup(IEnumerable<Parameter> parameters, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0, bool amsgrad = false, bool maximize = false) { }
        }
    }
}
