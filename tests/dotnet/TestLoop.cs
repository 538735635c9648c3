// A STAND-IN FOR TORCHSHARP, for optcheck's tests only.
//
// TorchSharp cannot be restored on this machine (no .NET SDK, no NuGet), so this small C# 7
// training loop (compiled with Debian's `mcs`) reproduces the parts of TorchSharp that decide
// whether an optimizer keeps up with its model, with real arithmetic so that its loss falls:
//
// - Each Param is a managed wrapper with its own native-handle-like IntPtr (a real
//   Marshal.AllocHGlobal address, one per wrapper, like Tensor.Handle) over a Storage whose
//   data has a real address (a pinned array, like THSTensor_data). Two wrappers can share
//   one Storage (TorchSharp: tying `lm_head.weight = wte.weight`; native modules converted
//   in place by Module.to).
// - HandleAdamW keeps per-parameter state in a non-public Dictionary keyed by that handle,
//   filled for every member when the optimizer is built, and in step() re-walks each group's
//   parameter enumerable and looks the state up BEFORE the null-grad check, as TorchSharp's
//   AdamW does (src/TorchSharp/Optimizers/AdamW.cs, `step`: `_state[param.handle]` then
//   `if (grad is null) continue;`; state filled in `add_param_group`; the `_state` field is
//   declared on OptimizerHelper in src/TorchSharp/Optimizers/Optimizer.cs). A group built from
//   a lazy enumerable over the model (TorchSharp's default `model.parameters()`) sees a
//   replaced parameter at the next step and throws KeyNotFoundException; a group built from a
//   materialised list silently keeps stepping the old wrappers.
// - The model: embedding `wte` (V x d), a plain-field elementwise gain/shift `ln_f` (like
//   nanoGPT's LayerNorm with two plain Parameter fields), and a linear head `lm_head`
//   (V x d weight, V bias): softmax cross-entropy over the next byte, exact gradients.
//
// Variants (trainer type names): OptCheckTest.LazyTrainer (default, the lazy TorchSharp
// pattern), OptCheckTest.EagerTrainer (groups from ToList()), OptCheckTest.TiedTrainer
// (`lm_head.weight = wte.weight` done the obvious way: two wrappers, one Storage).
// Faults (Inject): param-replaced, module-to-after-optimizer, param-registered-late,
// eager-param-list, state-leak (a Storage kept per step), no-dispose-scope (the step's 24 native
// temporaries left to the finalizer instead of disposed), failfast (Environment.FailFast: SIGABRT, exit 134). Setup option
// "extra.failfast_at" = N calls FailFast at the start of step N; "extra.hang_at" = N sleeps "extra.hang_s" seconds
// (default 60) there (a hung step); "extra.bug_after_at" = N plants "extra.bug" at the end of step N, after the
// optimizer step (the step completes; the check between steps N and N+1 sees it). "extra.nan_grad_at" = N puts a NaN into
// lm_head.bias's gradient at step N and skips that step's clipping and optimizer step (as
// torch.cuda.amp.GradScaler skips a step whose gradients are not finite): the parameters stay finite.
// "extra.nan_loss_at" = N: the loss the step returns is NaN from step N on (a model whose loss diverged;
// its parameters stay finite). In-step bug "nan-weight": the user's own Step writes a NaN into
// lm_head.weight before optimizer.step(), so every loss after it is NaN. NativeTrainer P/Invokes a
// native library that does not exist (DllNotFoundException in Setup).
using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using System.Runtime.InteropServices;
using OptCheck.Contract;
using OptCheck.Probe;

// the C# harnesses (tests/dotnet/guard_check) use the probe, which is internal in any assembly that compiles it in
[assembly: System.Runtime.CompilerServices.InternalsVisibleTo("GuardCheck")]
[assembly: System.Runtime.CompilerServices.InternalsVisibleTo("WrappedGuardCheck")]

namespace OptCheckTest
{
    /// <summary>Tensor data: a pinned double[] (its address is the data pointer) and its gradient.</summary>
    public sealed class Storage
    {
        public static long Live, Peak;

        /// <summary>One more live tensor (TorchSharp: Tensor.TotalCount++, PeakCount kept as the high-water mark).</summary>
        public static void Born()
        {
            long now = System.Threading.Interlocked.Increment(ref Live), peak;
            while (now > (peak = System.Threading.Interlocked.Read(ref Peak)) &&
                   System.Threading.Interlocked.CompareExchange(ref Peak, now, peak) != peak) { }
        }
        public readonly double[] Data;
        public double[] Grad;
        public string DType = "float32";
        GCHandle pin;

        public Storage(int n)
        {
            Data = new double[n];
            pin = GCHandle.Alloc(Data, GCHandleType.Pinned);
            Born();
        }

        public long DataPtr { get { return pin.AddrOfPinnedObject().ToInt64(); } }

        ~Storage()
        {
            if (pin.IsAllocated) pin.Free();
            System.Threading.Interlocked.Decrement(ref Live);
        }
    }

    /// <summary>A step's temporary (an activation): native memory the GC does not see, freed by
    /// Dispose (a DisposeScope) or, when nobody disposes it, by the finalizer whenever the GC runs,
    /// as a TorchSharp tensor is. Counts in Storage.Live / Peak and in the DisposeScope statistics.</summary>
    public sealed class Temp : IDisposable
    {
        public const int Bytes = 16 * 1024;
        /// <summary>The thread's DisposeScope bookkeeping (TorchSharp: DisposeScopeManager.Statistics).</summary>
        public static long CreatedOutsideScope, DisposedOutsideScope;
        IntPtr mem;
        readonly bool outside;

        public Temp(bool inScope)
        {
            mem = Marshal.AllocHGlobal(Bytes);
            outside = !inScope;
            if (outside) CreatedOutsideScope++;
            Storage.Born();
        }

        void Free()
        {
            IntPtr m = System.Threading.Interlocked.Exchange(ref mem, IntPtr.Zero);
            if (m == IntPtr.Zero) return;
            Marshal.FreeHGlobal(m);
            System.Threading.Interlocked.Decrement(ref Storage.Live);
        }

        public void Dispose()
        {
            if (outside && mem != IntPtr.Zero) DisposedOutsideScope++;
            Free();
            GC.SuppressFinalize(this);
        }

        ~Temp() { Free(); }  // on the finalizer thread: not this thread's DisposedOutsideScope
    }

    /// <summary>A parameter wrapper with its own handle (TorchSharp: Parameter / Tensor.Handle).</summary>
    public sealed class Param
    {
        public readonly IntPtr Handle;
        public readonly Storage Storage;
        public readonly long[] Shape;
        public bool IsLeaf = true;
        public bool RequiresGrad = true;
        /// <summary>TorchSharp 0.107.0's Module.to(dtype) disposes the tensors it replaced: an optimizer
        /// that still holds one reads Handle 0 (IsInvalid) and its zero_grad()/step() throws
        /// InvalidOperationException (docs/torchsharp.md, "Disposed tensors").</summary>
        public bool Disposed;

        public Param(Storage storage, long[] shape)
        {
            Storage = storage;
            Shape = shape;
            Handle = Marshal.AllocHGlobal(16);
        }

        public Param(long[] shape) : this(new Storage((int)shape.Aggregate(1L, (a, b) => a * b)), shape) { }

        public double[] Data { get { return Storage.Data; } }
        public double[] Grad { get { return Storage.Grad; } }

        ~Param() { Marshal.FreeHGlobal(Handle); }
    }

    /// <summary>The model; fields named as nanoGPT's (wte, ln_f, lm_head).</summary>
    public sealed class TinyLM
    {
        public readonly int V, D;
        public Param WteWeight, LnFWeight, LnFBias, LmHeadWeight, LmHeadBias;
        public readonly List<KeyValuePair<string, Param>> Extra = new List<KeyValuePair<string, Param>>();

        public TinyLM(int vocab, int d, Random rng)
        {
            V = vocab; D = d;
            WteWeight = Normal(new long[] { V, D }, rng, 0.1);
            LnFWeight = Fill(new long[] { D }, 1.0);
            LnFBias = Fill(new long[] { D }, 0.0);
            LmHeadWeight = Normal(new long[] { V, D }, rng, 0.1);
            LmHeadBias = Fill(new long[] { V }, 0.0);
        }

        static Param Normal(long[] shape, Random rng, double std)
        {
            var p = new Param(shape);
            for (int i = 0; i < p.Data.Length; i++) {
                double u1 = 1.0 - rng.NextDouble(), u2 = rng.NextDouble();
                p.Data[i] = std * Math.Sqrt(-2.0 * Math.Log(u1)) * Math.Cos(2 * Math.PI * u2);
            }
            return p;
        }

        static Param Fill(long[] shape, double v)
        {
            var p = new Param(shape);
            for (int i = 0; i < p.Data.Length; i++) p.Data[i] = v;
            return p;
        }

        /// <summary>named_parameters(): walks the model's current fields (registered objects).</summary>
        public IEnumerable<KeyValuePair<string, Param>> NamedParameters()
        {
            yield return new KeyValuePair<string, Param>("wte.weight", WteWeight);
            yield return new KeyValuePair<string, Param>("ln_f.weight", LnFWeight);
            yield return new KeyValuePair<string, Param>("ln_f.bias", LnFBias);
            yield return new KeyValuePair<string, Param>("lm_head.weight", LmHeadWeight);
            yield return new KeyValuePair<string, Param>("lm_head.bias", LmHeadBias);
            foreach (var kv in Extra) yield return kv;
        }

        /// <summary>parameters(): lazy, like TorchSharp's Module.parameters().</summary>
        public IEnumerable<Param> Parameters()
        {
            foreach (var kv in NamedParameters()) yield return kv.Value;
        }

        /// <summary>Mean next-token cross-entropy over n positions; with grads when backward.</summary>
        public double Loss(long[] x, long[] y, int n, bool backward)
        {
            double[] wte = WteWeight.Data, g = LnFWeight.Data, b = LnFBias.Data, w = LmHeadWeight.Data, c = LmHeadBias.Data;
            double[] dwte = null, dg = null, db = null, dw = null, dc = null;
            if (backward) {
                dwte = WteWeight.Grad; dg = LnFWeight.Grad; db = LnFBias.Grad; dw = LmHeadWeight.Grad; dc = LmHeadBias.Grad;
            }
            var h = new double[D]; var dh = new double[D]; var logits = new double[V];
            double total = 0;
            for (int i = 0; i < n; i++) {
                int tok = (int)x[i], tgt = (int)y[i];
                if (tok < 0 || tok >= V || tgt < 0 || tgt >= V)
                    throw new ArgumentOutOfRangeException("x", "token id " + Math.Max(tok, tgt) + " is not below the vocabulary size " + V);
                int eo = tok * D;
                for (int j = 0; j < D; j++) h[j] = wte[eo + j] * g[j] + b[j];
                double max = double.NegativeInfinity;
                for (int v = 0; v < V; v++) {
                    double s = c[v];
                    int wo = v * D;
                    for (int j = 0; j < D; j++) s += w[wo + j] * h[j];
                    logits[v] = s;
                    if (s > max) max = s;
                }
                double z = 0;
                for (int v = 0; v < V; v++) { logits[v] = Math.Exp(logits[v] - max); z += logits[v]; }
                total += -(Math.Log(logits[tgt] / z));
                if (!backward) continue;
                Array.Clear(dh, 0, D);
                for (int v = 0; v < V; v++) {
                    double dl = (logits[v] / z - (v == tgt ? 1.0 : 0.0)) / n;
                    dc[v] += dl;
                    int wo = v * D;
                    for (int j = 0; j < D; j++) { dw[wo + j] += dl * h[j]; dh[j] += dl * w[wo + j]; }
                }
                for (int j = 0; j < D; j++) {
                    dg[j] += dh[j] * wte[eo + j];
                    db[j] += dh[j];
                    dwte[eo + j] += dh[j] * g[j];
                }
            }
            return total / n;
        }
    }

    /// <summary>One param group: options and the enumerable it was given (lazy or a list).</summary>
    public sealed class Group
    {
        public IEnumerable<Param> Parameters;
        public double Lr, Beta1, Beta2, Eps, WeightDecay;
    }

    /// <summary>AdamW keeping state by handle, as TorchSharp's (see the file header).</summary>
    public sealed class HandleAdamW
    {
        public sealed class State
        {
            public long step;
            public Storage exp_avg, exp_avg_sq;
            public long[] shape;
        }

        public readonly List<Group> Groups = new List<Group>();
        // Non-public, read by the probe by reflection, as TorchSharp's OptimizerHelper._state.
        Dictionary<IntPtr, State> _state = new Dictionary<IntPtr, State>();

        public HandleAdamW(IEnumerable<Group> groups)
        {
            foreach (var g in groups) AddParamGroup(g);
        }

        public void AddParamGroup(Group g)
        {
            Groups.Add(g);
            foreach (var p in g.Parameters)
                _state[p.Handle] = new State { exp_avg = new Storage(p.Data.Length), exp_avg_sq = new Storage(p.Data.Length), shape = p.Shape };
        }

        /// <summary>Run before ZeroGrad() and Step() with "zero_grad()" / "step()": the stand-in of
        /// OptCheck.Contract.GuardedOptimizer (PreStepGuard.Before).</summary>
        public Action<string> Before;

        public void ZeroGrad()
        {
            if (Before != null) Before("zero_grad()");
            foreach (var g in Groups)
                foreach (var p in g.Parameters) {
                    if (p.Disposed) throw new InvalidOperationException("Tensor invalid -- empty handle.");
                    if (p.Grad != null) Array.Clear(p.Grad, 0, p.Grad.Length);
                }
        }

        public void Step()
        {
            if (Before != null) Before("step()");
            foreach (var g in Groups) {
                foreach (var p in g.Parameters) {
                    if (p.Disposed) throw new InvalidOperationException("Tensor invalid -- empty handle.");
                    State st = _state[p.Handle];          // before the null-grad check, as TorchSharp
                    double[] grad = p.Grad;
                    if (grad == null) continue;
                    st.step += 1;
                    double[] d = p.Data, m = st.exp_avg.Data, v = st.exp_avg_sq.Data;
                    double bc1 = 1 - Math.Pow(g.Beta1, st.step), bc2 = 1 - Math.Pow(g.Beta2, st.step);
                    double decay = 1 - g.Lr * g.WeightDecay, stepSize = g.Lr / bc1, sq = Math.Sqrt(bc2);
                    for (int i = 0; i < d.Length; i++) {
                        d[i] *= decay;
                        m[i] = g.Beta1 * m[i] + (1 - g.Beta1) * grad[i];
                        v[i] = g.Beta2 * v[i] + (1 - g.Beta2) * grad[i] * grad[i];
                        d[i] -= stepSize * m[i] / (Math.Sqrt(v[i]) / sq + g.Eps);
                    }
                }
            }
        }
    }

    // -- the probe adapter: what part 2 writes for TorchSharp ----------------------------------

    sealed class ParamView : IParameterView, IParameterValues
    {
        readonly Param p; readonly string name;
        public ParamView(string name, Param p) { this.name = name; this.p = p; }
        public string Name { get { return name; } }
        public long Handle { get { return p.Disposed ? 0 : p.Handle.ToInt64(); } }
        public long DataPtr { get { return p.Disposed ? 0 : p.Storage.DataPtr; } }
        public bool IsLeaf { get { return p.IsLeaf; } }
        public bool RequiresGrad { get { return p.RequiresGrad; } }
        public long[] Shape { get { return p.Shape; } }
        public string DType { get { return p.Disposed ? "disposed" : p.Storage.DType; } }
        public string Device { get { return "cpu"; } }
        public bool HasGrad { get { return p.Grad != null; } }
        public double GradNorm()
        {
            if (p.Grad == null) return double.NaN;
            double s = 0;
            foreach (double v in p.Grad) s += v * v;
            return Math.Sqrt(s);
        }
        // the stand-in keeps its values as float64 in pinned memory: the probe's one-pass reader over it
        public bool ReadValues(out double valueNorm, out long checksum)
        {
            if (p.Disposed) { valueNorm = double.NaN; checksum = 0; return false; }
            ValueStats.Float64(new IntPtr(p.Storage.DataPtr), p.Data.Length, out valueNorm, out checksum);
            return true;
        }
    }

    sealed class GroupView : IParamGroupView
    {
        readonly Group g;
        readonly bool native;
        public GroupView(Group g, bool native) { this.g = g; this.native = native; }
        public string[] OptionNames { get { return new[] { "lr", "beta1", "beta2", "eps", "weight_decay" }; } }
        public double[] OptionValues { get { return new[] { g.Lr, g.Beta1, g.Beta2, g.Eps, g.WeightDecay }; } }
        public IList<IParameterView> Members()
        {
            if (native) return null;   // as TorchSharpTarget reports a native optimizer's (LBFGS) groups
            var l = new List<IParameterView>();
            foreach (var p in g.Parameters) l.Add(new ParamView(null, p));
            return l;
        }
    }

    sealed class Target : IProbeTarget, IDisposeScopeStatistics, IProbeNotes
    {
        readonly TestTrainer t;
        public Target(TestTrainer t) { this.t = t; }
        public IList<IParameterView> ModelParameters()
        {
            var l = new List<IParameterView>();
            foreach (var kv in t.Model.NamedParameters()) l.Add(new ParamView(kv.Key, kv.Value));
            return l;
        }
        public IList<IParamGroupView> ParamGroups()
        {
            var l = new List<IParamGroupView>();
            foreach (var g in t.Optimizer.Groups) l.Add(new GroupView(g, t.NativeOptimizer));
            return l;
        }
        public object StateOwner { get { return t.NativeOptimizer ? null : t.Optimizer; } }
        public IList<string> Notes {
            get {
                return t.NativeOptimizer
                    ? new[] { "optimizer state not readable: the stand-in's native optimizer (as libtorch's LBFGS)" } : null;
            }
        }
        public string StateFieldName { get { return "_state"; } }
        public StateView DescribeState(object key, object value)
        {
            var s = value as HandleAdamW.State;
            if (s == null) return null;
            var sv = new StateView { Step = s.step };
            string dt = s.exp_avg.DType;
            return sv.Add("exp_avg", s.shape, dt).Add("exp_avg_sq", s.shape, dt);
        }
        public string OptimizerType { get { return "AdamW"; } }
        public long LiveTensors { get { return System.Threading.Interlocked.Read(ref Storage.Live); } }
        public long PeakTensors { get { return System.Threading.Interlocked.Read(ref Storage.Peak); } }
        public long TensorsCreatedOutsideScope { get { return Temp.CreatedOutsideScope; } }
        public long TensorsDisposedOutsideScope { get { return Temp.DisposedOutsideScope; } }
        public long TensorsDetachedFromScope { get { return 0; } }   // the stand-in has no scopes to leave
        public long TensorsAttachedToScope { get { return 0; } }
    }

    // -- the trainers ----------------------------------------------------------------------------

    /// <summary>The lazy TorchSharp pattern: groups enumerate the model's current parameters.</summary>
    public class TestTrainer : ITrainer
    {
        public TinyLM Model;
        HandleAdamW optimizer;
        /// <summary>The optimizer; a trainer with an in-step guard (InStepTrainer) hooks it into every one it gets.</summary>
        public HandleAdamW Optimizer {
            get { return optimizer; }
            set { optimizer = value; if (value != null && InStepGuard != null) value.Before = InStepGuard.Before; }
        }
        /// <summary>The guard the optimizer's zero_grad()/step() run (InStepTrainer), or null.</summary>
        protected PreStepGuard InStepGuard;
        TrainerOptions opts;
        double[][] checkpoint;
        readonly Target target;

        public TestTrainer() { target = new Target(this); }

        protected virtual bool Eager { get { return opts != null && opts.String("extra.bug", "") == "eager-to-float64"; } }
        protected virtual bool Tied { get { return false; } }
        /// <summary>The optimizer read as TorchSharpTarget reads libtorch's native ones (NativeOptimizerTrainer).</summary>
        public virtual bool NativeOptimizer { get { return false; } }
        /// <summary>Backward every step but never optimizer.step() (NoStepTrainer).</summary>
        protected virtual bool SkipsOptimizerStep { get { return false; } }

        double D(string k, double def)
        {
            return opts.Double(k, def);
        }

        public virtual void Setup(string configJson)
        {
            opts = TrainerOptions.FromJson(configJson);
            int vocab = (int)D("vocab_size", 256), d = (int)D("n_embd", 16);
            if (vocab < 2 || d < 1) throw new ArgumentException("vocab_size and n_embd must be positive");
            Model = new TinyLM(vocab, d, new Random((int)D("seed", 1337)));
            if (Tied) Model.LmHeadWeight = new Param(Model.WteWeight.Storage, Model.WteWeight.Shape);
            Optimizer = BuildOptimizer();
        }

        HandleAdamW BuildOptimizer() { return BuildOptimizer(Eager); }

        HandleAdamW BuildOptimizer(bool eager)
        {
            double lr = D("lr", 1e-3), b1 = D("beta1", 0.9), b2 = D("beta2", 0.95), eps = D("eps", 1e-8), wd = D("weight_decay", 0.1);
            TinyLM m = Model;
            IEnumerable<Param> decay = m.Parameters().Where(p => p.Shape.Length >= 2);   // deferred: re-walks the model
            IEnumerable<Param> noDecay = m.Parameters().Where(p => p.Shape.Length < 2);
            if (eager) { decay = decay.ToList(); noDecay = noDecay.ToList(); }
            return new HandleAdamW(new[] {
                new Group { Parameters = decay, Lr = lr, Beta1 = b1, Beta2 = b2, Eps = eps, WeightDecay = wd },
                new Group { Parameters = noDecay, Lr = lr, Beta1 = b1, Beta2 = b2, Eps = eps, WeightDecay = 0.0 },
            });
        }

        public double Step(long step, long[] inputs, long[] targets, int batch, int time)
        {
            if (D("extra.failfast_at", -1) == step) Environment.FailFast("optcheck test loop: FailFast at step " + step);
            if (D("extra.hang_at", -1) == step) System.Threading.Thread.Sleep((int)(1000 * D("extra.hang_s", 60)));
            if (D("extra.bug_at", -1) == step && BugBeforeZeroGrad) PlantBug();
            foreach (var p in Model.Parameters()) {
                if (p.Storage.Grad == null) p.Storage.Grad = new double[p.Data.Length];
            }
            Optimizer.ZeroGrad();
            foreach (var p in Model.Parameters()) Array.Clear(p.Storage.Grad, 0, p.Storage.Grad.Length);
            // the step's temporaries (TorchSharp: forward and backward intermediates), disposed at the end
            // of the step by its DisposeScope unless the no-dispose-scope fault removed it
            var temps = new List<Temp>(TempsPerStep);
            for (int i = 0; i < TempsPerStep; i++) temps.Add(new Temp(!noDisposeScope));
            double loss = Model.Loss(inputs, targets, batch * time, true);
            bool nanGrad = D("extra.nan_grad_at", -1) == step;
            if (nanGrad) Model.LmHeadBias.Grad[0] = double.NaN;
            double clip = D("grad_clip", 1.0);
            if (clip > 0 && !nanGrad) Clip(clip);
            if (D("extra.bug_at", -1) == step && !BugBeforeZeroGrad) PlantBug();
            if (!SkipsOptimizerStep && !nanGrad) Optimizer.Step();
            if (keepLosses) {  // `losses.Add(loss)`: the loss and the activation it holds, never released
                var kept = new Storage(batch * time * Model.D);
                kept.Data[0] = loss;
                keptLosses.Add(kept);
            }
            if (!noDisposeScope) foreach (Temp t in temps) t.Dispose();
            if (D("extra.bug_after_at", -1) == step) PlantBug();  // after the optimizer: the next step meets it
            double nanFrom = D("extra.nan_loss_at", -1);
            return nanFrom > 0 && step >= nanFrom ? double.NaN : loss;
        }

        /// <summary>The user's own bug, planted inside Step ("extra.bug", at step "extra.bug_at"): to-float64
        /// (model.to(Float64)), param-replaced (lm_head.weight = new Parameter), register-late (register_parameter),
        /// eager-to-float64 (the optimizer was built over parameters().ToList(); model.to(Float64) disposes the old
        /// tensors), dispose (lm_head.bias.Dispose()). eager-to-float64 and dispose go before zero_grad(), the
        /// others between backward and optimizer.step(); throw: an exception of the user's own, nothing wrong with
        /// the model or the optimizer.</summary>
        void PlantBug()
        {
            switch (opts.String("extra.bug", "")) {
                case "to-float64": Inject("module-to-after-optimizer"); break;
                case "param-replaced": Inject("param-replaced"); break;
                case "register-late": Inject("param-registered-late"); break;
                case "eager-to-float64": {
                    var held = new List<Param>();
                    foreach (var g in Optimizer.Groups) held.AddRange(g.Parameters);
                    Inject("module-to-after-optimizer");
                    var now = new HashSet<Param>(Model.Parameters());
                    foreach (var p in held) if (!now.Contains(p)) p.Disposed = true;
                    break;
                }
                case "dispose": Model.LmHeadBias.Disposed = true; break;
                case "nan-weight": Model.LmHeadWeight.Data[0] = double.NaN; break;
                case "throw": throw new InvalidOperationException("the user's own Step failed (no model or optimizer fault)");
                default: throw new ArgumentException("the test loop has no in-step bug '" + opts.String("extra.bug", "") + "'");
            }
        }

        bool BugBeforeZeroGrad {
            get { string b = opts.String("extra.bug", ""); return b == "eager-to-float64" || b == "dispose"; }
        }

        /// <summary>Temporaries a step makes (a TorchSharp GPT step makes ~180; fewer keep the test fast).</summary>
        public const int TempsPerStep = 24;
        bool noDisposeScope, keepLosses;
        /// <summary>Module.to disposes the tensors it replaces (TorchSharp 0.107.0; DisposingTrainer).</summary>
        protected bool DisposesReplaced;
        readonly List<Storage> keptLosses = new List<Storage>();

        void Clip(double max)
        {
            var seen = new HashSet<Storage>();
            double s = 0;
            foreach (var p in Model.Parameters()) if (seen.Add(p.Storage)) foreach (double v in p.Grad) s += v * v;
            double norm = Math.Sqrt(s);
            if (norm <= max) return;
            double k = max / (norm + 1e-6);
            foreach (var st in seen) for (int i = 0; i < st.Grad.Length; i++) st.Grad[i] *= k;
        }

        public double EvalLoss(long[] inputs, long[] targets, int batch, int time)
        {
            return Model.Loss(inputs, targets, batch * time, false);
        }

        IProbeTarget ITrainer.Target { get { return target; } }

        public string[] Scenarios
        {
            get { return new[] { "param-replaced", "module-to-after-optimizer", "param-registered-late", "eager-param-list",
                                 "state-leak", "no-dispose-scope", "failfast" }; }
        }

        public string Inject(string name)
        {
            switch (name) {
                case "param-replaced": {
                    var old = Model.LmHeadWeight;
                    var p = new Param(old.Shape);
                    Array.Copy(old.Data, p.Data, old.Data.Length);
                    Model.LmHeadWeight = p;
                    return "model.lm_head.weight = new Parameter(copy of lm_head.weight)";
                }
                case "module-to-after-optimizer": {
                    // TorchSharp Module.to(Float64): native modules get new wrappers on their converted
                    // tensors (same data here); plain Parameter fields become param.to(dtype) + retain_grad:
                    // new data, non-leaf (docs/torchsharp.md; fixture ...-eager-to-float64.jsonl).
                    Model.WteWeight = Rewrap(Model.WteWeight);
                    Model.LmHeadWeight = Tied ? new Param(Model.WteWeight.Storage, Model.WteWeight.Shape) : Rewrap(Model.LmHeadWeight);
                    Model.LmHeadBias = Rewrap(Model.LmHeadBias);
                    Model.LnFWeight = Copy64(Model.LnFWeight);
                    Model.LnFBias = Copy64(Model.LnFBias);
                    return "model.to(ScalarType.Float64)";
                }
                case "param-registered-late": {
                    var p = new Param(new long[] { Model.D });
                    Model.Extra.Add(new KeyValuePair<string, Param>("extra.gain", p));
                    return "model.register_parameter(\"extra.gain\", new Parameter(...))";
                }
                case "eager-param-list": {
                    // The optimizer rebuilt from materialised lists (fresh state), then Module.to(Float64).
                    Optimizer = BuildOptimizer(true);
                    var held = new List<Param>();
                    foreach (var g in Optimizer.Groups) held.AddRange(g.Parameters);
                    Inject("module-to-after-optimizer");
                    if (!DisposesReplaced) return "optimizer = AdamW(model.parameters().ToList()); model.to(ScalarType.Float64)";
                    var now = new HashSet<Param>(Model.Parameters());
                    foreach (var p in held) if (!now.Contains(p)) p.Disposed = true;
                    return "optimizer = AdamW(model.parameters().ToList()); model.to(ScalarType.Float64), which disposes the replaced tensors";
                }
                case "state-leak":
                    keepLosses = true;
                    return "losses.Add(loss) every step (the loss and its activation, never disposed)";
                case "no-dispose-scope":
                    noDisposeScope = true;
                    return "the training step run without its DisposeScope: its temporaries wait for the GC";
                case "failfast":
                    Environment.FailFast("optcheck test loop: FailFast injected");
                    return "Environment.FailFast";
                default:
                    throw new ArgumentException("the test loop has no fault '" + name + "' (it has: " + string.Join(", ", Scenarios) + ")");
            }
        }

        static Param Rewrap(Param p)
        {
            p.Storage.DType = "float64";
            return new Param(p.Storage, p.Shape);
        }

        static Param Copy64(Param p)
        {
            var q = new Param(p.Shape);
            Array.Copy(p.Data, q.Data, p.Data.Length);
            q.Storage.DType = "float64";
            q.IsLeaf = false;
            q.Storage.Grad = null;
            return q;
        }

        public string Lifecycle(string kind)
        {
            switch (kind) {
                case "eval":
                    return "eval (no-op round trip)";
                case "checkpoint": {
                    checkpoint = Model.Parameters().Select(p => (double[])p.Data.Clone()).ToArray();
                    int i = 0;
                    foreach (var p in Model.Parameters()) { Array.Copy(checkpoint[i], p.Data, p.Data.Length); i++; }
                    return "saved and loaded back " + checkpoint.Length + " parameters in place";
                }
                case "resume": {
                    if (checkpoint == null) checkpoint = Model.Parameters().Select(p => (double[])p.Data.Clone()).ToArray();
                    Model = new TinyLM(Model.V, Model.D, new Random(0));
                    if (Tied) Model.LmHeadWeight = new Param(Model.WteWeight.Storage, Model.WteWeight.Shape);
                    int i = 0;
                    foreach (var p in Model.Parameters()) { Array.Copy(checkpoint[i], p.Data, p.Data.Length); i++; }
                    Optimizer = BuildOptimizer();
                    return "rebuilt model and optimizer from the last checkpoint";
                }
                default:
                    throw new NotSupportedException("lifecycle event '" + kind + "'");
            }
        }

        public string[] Versions
        {
            get {
                return new[] { "testloop=1", "clr=" + Environment.Version };
            }
        }

        public int Threads { get { return 1; } }
    }

    /// <summary>Optimizer groups built from materialised lists (model.parameters().ToList()).</summary>
    /// <summary>TorchSharp 0.107.0's Module.to(dtype): the tensors it replaces are disposed, so an optimizer
    /// built from a materialised list holds disposed tensors (the recorded run eager-param-list-1000 in
    /// tests/fixtures/torchsharp/0.107.0-runs); 0.99.6 left them alive (EagerTrainer).</summary>
    public sealed class DisposingTrainer : TestTrainer
    {
        public DisposingTrainer() { DisposesReplaced = true; }
    }

    public sealed class EagerTrainer : TestTrainer
    {
        protected override bool Eager { get { return true; } }
    }

    /// <summary>lm_head.weight = wte.weight at construction: two wrappers, one Storage.</summary>
    public sealed class TiedTrainer : TestTrainer
    {
        protected override bool Tied { get { return true; } }
    }

    /// <summary>Setup P/Invokes a native library that does not exist: DllNotFoundException, as TorchSharp
    /// throws when LibTorchSharp cannot be found (docs/torchsharp.md).</summary>
    public sealed class NativeTrainer : TestTrainer
    {
        [DllImport("LibOptcheckMissingNative")]
        static extern int optcheck_missing_native();

        public override void Setup(string configJson)
        {
            optcheck_missing_native();
        }
    }

    /// <summary>Gradients every step, optimizer.step() never called: the values stay bit-for-bit the same
    /// (OC205 from the probe's checksums; the stand-in's state keeps no step count to ask).</summary>
    public sealed class NoStepTrainer : TestTrainer
    {
        protected override bool SkipsOptimizerStep { get { return true; } }
    }

    /// <summary>The optimizer as optcheck sees libtorch's native LBFGS: members and state not readable.</summary>
    public sealed class NativeOptimizerTrainer : TestTrainer
    {
        public override bool NativeOptimizer { get { return true; } }
    }

    /// <summary>The lazy trainer under its default name.</summary>
    public sealed class LazyTrainer : TestTrainer { }

    /// <summary>A user's own trainer as ModuleTrainer makes it: its optimizer's zero_grad() and step() run the
    /// in-step guard (the stand-in of GuardedOptimizer). Plant a bug inside Step with "extra.bug" / "extra.bug_at".
    /// Under optcheck's Driver the guard records; run by hand (GuardCheck) it throws PreStepCheckException.</summary>
    public sealed class InStepTrainer : TestTrainer, IGuardedTrainer
    {
        public InStepTrainer() { InStepGuard = new PreStepGuard(((ITrainer)this).Target); }
        PreStepGuard IGuardedTrainer.Guard { get { return InStepGuard; } }
    }
}
