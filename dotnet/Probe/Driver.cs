// What the Python worker (optcheck/torchsharp_bridge/worker.py) calls: one call per block of
// steps between two things Python must do (StepBlock: the batches already in the bound buffers,
// each step's pre-step fingerprint computed after it and compared here, losses and step times
// written beside them; StepBound: one step, for an assembly without StepBlock), one per snapshot. Batches arrive as int64 row-major
// (batch, time) arrays owned by Python (numpy), copied here into reused long[] buffers.
// Benchmark-only loops are in Bench.cs.
using System;
using System.Diagnostics;
using System.Reflection;
using System.Runtime.InteropServices;
using OptCheck.Contract;

namespace OptCheck.Probe
{
    internal sealed class Driver
    {
        readonly ITrainer trainer;
        ProbeCore probe;
        PreStepGuard guard;   // the trainer's in-step guard (IGuardedTrainer), recording
        internal long[] xbuf = new long[0], ybuf = new long[0];

        public Driver(ITrainer trainer)
        {
            if (trainer == null) throw new ArgumentNullException("trainer");
            this.trainer = trainer;
        }

        /// <summary>Construct the ITrainer named <paramref name="typeName"/> (a full type name, looked up in
        /// this assembly, then in every loaded assembly) and wrap it; null or "": the one trainer type this
        /// assembly holds (TrainerTypes).</summary>
        /// <exception cref="ArgumentException">no such type, or it does not implement ITrainer; no name and not
        /// exactly one trainer type in this assembly (the message lists them).</exception>
        public static Driver ForType(string typeName)
        {
            if (string.IsNullOrEmpty(typeName)) {
                string[] found = TrainerTypes();
                if (found.Length != 1)
                    throw new ArgumentException(typeof(Driver).Assembly.GetName().Name + " holds " +
                                                (found.Length == 0 ? "no trainer type (a public class derived from OptCheck.Contract.ModuleTrainer " +
                                                                     "with a public parameterless constructor)"
                                                                   : found.Length + " trainer types: " + string.Join(", ", found) +
                                                                     "; name one with --dotnet-trainer"));
                typeName = found[0];
            }
            Type t = typeof(Driver).Assembly.GetType(typeName);
            if (t == null) {
                foreach (Assembly a in AppDomain.CurrentDomain.GetAssemblies()) {
                    t = a.GetType(typeName);
                    if (t != null) break;
                }
            }
            if (t == null)
                throw new ArgumentException("no trainer type '" + typeName + "' in " + typeof(Driver).Assembly.GetName().Name +
                                            " or any loaded assembly");
            if (!typeof(ITrainer).IsAssignableFrom(t))
                throw new ArgumentException("type '" + typeName + "' does not implement OptCheck.Probe.ITrainer");
            return new Driver((ITrainer)Activator.CreateInstance(t));
        }

        /// <summary>The full names of this assembly's trainer types: public, concrete, implementing ITrainer, with a
        /// public parameterless constructor; sorted.</summary>
        public static string[] TrainerTypes()
        {
            var r = new System.Collections.Generic.List<string>();
            Type[] types;
            try { types = typeof(Driver).Assembly.GetTypes(); }
            catch (ReflectionTypeLoadException e) { types = e.Types; }
            foreach (Type t in types) {
                if (t == null || !t.IsPublic || t.IsAbstract || t.IsInterface || !typeof(ITrainer).IsAssignableFrom(t)) continue;
                if (t.GetConstructor(Type.EmptyTypes) == null) continue;
                r.Add(t.FullName);
            }
            r.Sort(StringComparer.Ordinal);
            return r.ToArray();
        }

        public ITrainer Trainer { get { return trainer; } }

        /// <summary>Build model and optimizer (ITrainer.Setup, one JSON object: Interfaces.cs), then the
        /// probe over ITrainer.Target.</summary>
        /// <exception cref="ArgumentException">the trainer rejected the configuration (bad JSON, a bad value).</exception>
        public void Setup(string configJson)
        {
            trainer.Setup(configJson);
            probe = new ProbeCore(trainer.Target);
            var guarded = trainer as IGuardedTrainer;
            guard = guarded == null ? null : guarded.Guard;
            if (guard != null) guard.Recording = true;
        }

        /// <summary>True when the trainer's optimizer calls run the in-step check (IGuardedTrainer).</summary>
        public bool InStepChecked { get { return guard != null; } }

        ProbeCore P
        {
            get {
                if (probe == null) throw new InvalidOperationException("Driver.Setup was not called");
                return probe;
            }
        }

        internal void Load(IntPtr x, IntPtr y, int batch, int time)
        {
            int n = checked(batch * time);
            if (xbuf.Length != n) { xbuf = new long[n]; ybuf = new long[n]; }
            Marshal.Copy(x, xbuf, 0, n);
            Marshal.Copy(y, ybuf, 0, n);
        }

        IntPtr boundX, boundY, fpSink;
        int boundCapacity;

        /// <summary>Bind two int64 buffers of <paramref name="capacity"/> elements (Python keeps them alive and
        /// writes the inputs/targets there: one step's for StepBound, a block's one after the other for StepBlock)
        /// and a sink of int64s that StepBound fills with the fingerprint after the step and the in-step flag
        /// (two), StepBlock with those and the steps done (three): then a step, or a block of steps, is one
        /// call with a few integers.</summary>
        public void Bind(IntPtr x, IntPtr y, int capacity, IntPtr fingerprintSink)
        {
            if (capacity < 0) throw new ArgumentOutOfRangeException("capacity");
            boundX = x; boundY = y; boundCapacity = capacity; fpSink = fingerprintSink;
        }

        /// <summary>Step on the bound buffers' first batch*time elements, then write Fingerprint() (the
        /// pre-step check of the next step, unless something changes the model in between) to the sink's
        /// first int64, and 1 to its second when the in-step check found something during the step
        /// (TakeInStep has it), else 0. Whatever the trainer throws propagates (KeyNotFoundException from
        /// AdamW.step, ...); TakeInStep then still has what the in-step check found before it.</summary>
        /// <exception cref="InvalidOperationException">Bind was not called, or batch*time exceeds its capacity.</exception>
        public double StepBound(long step, int batch, int time)
        {
            if (boundX == IntPtr.Zero || checked(batch * time) > boundCapacity)
                throw new InvalidOperationException("Driver.StepBound: bind buffers of at least batch*time elements first (Driver.Bind)");
            Load(boundX, boundY, batch, time);
            if (guard != null) { guard.Step = step; guard.HaveStepFingerprint = false; }
            double loss = trainer.Step(step, xbuf, ybuf, batch, time);
            if (fpSink != IntPtr.Zero) {
                // a guarded trainer's optimizer.step() computed it already (a change after that call, still inside
                // Step, is then seen by the next step's guarded zero_grad(), before anything can throw)
                bool reuse = guard != null && guard.HaveStepFingerprint;
                Marshal.WriteInt64(fpSink, reuse ? guard.StepFingerprint : P.Fingerprint());
                Marshal.WriteInt64(fpSink, 8, guard != null && guard.Pending != null ? 1 : 0);
            }
            return loss;
        }

        IntPtr blockLoss, blockSeconds;
        int blockSteps;

        /// <summary>Bind two float64 buffers of <paramref name="steps"/> elements that StepBlock fills with each
        /// step's loss and its seconds (Stopwatch, the trainer's Step alone).</summary>
        public void BindBlock(IntPtr losses, IntPtr seconds, int steps)
        {
            if (steps < 0) throw new ArgumentOutOfRangeException("steps");
            blockLoss = losses; blockSeconds = seconds; blockSteps = steps;
        }

        /// <summary>Up to <paramref name="count"/> steps first..first+count-1 in one call, step i on the i-th
        /// batch*time block of the bound buffers (Bind), each step followed by what StepBound writes (the
        /// fingerprint, the in-step flag) and then by its loss and seconds (BindBlock) and the number of steps
        /// done so far in the sink's third int64. The block ends early, after the step, when the fingerprint
        /// is not <paramref name="reference"/> (the next step's pre-step check fires: the caller snapshots
        /// before it), when the in-step check found something during the step (TakeInStep), or when
        /// <paramref name="budgetSeconds"/> have passed (so that progress is reported); at least one step
        /// runs. Returns the steps done. Whatever a step throws propagates, with the steps before it done
        /// and counted in the sink (the step that threw is first + that count).</summary>
        /// <exception cref="InvalidOperationException">Bind or BindBlock was not called, or the block does not fit.</exception>
        public int StepBlock(long first, int count, int batch, int time, long reference, double budgetSeconds)
        {
            int bt = checked(batch * time);
            if (boundX == IntPtr.Zero || fpSink == IntPtr.Zero || blockLoss == IntPtr.Zero || count < 1 ||
                count > blockSteps || checked(count * bt) > boundCapacity)
                throw new InvalidOperationException("Driver.StepBlock: bind buffers of at least count*batch*time elements " +
                                                    "and count results first (Driver.Bind, Driver.BindBlock)");
            if (xbuf.Length != bt) { xbuf = new long[bt]; ybuf = new long[bt]; }
            Marshal.WriteInt64(fpSink, 16, 0);
            long budget = (long)(budgetSeconds * Stopwatch.Frequency);
            long start = Stopwatch.GetTimestamp();
            for (int i = 0; i < count; i++) {
                long offset = (long)i * bt * 8;
                Marshal.Copy(new IntPtr(boundX.ToInt64() + offset), xbuf, 0, bt);
                Marshal.Copy(new IntPtr(boundY.ToInt64() + offset), ybuf, 0, bt);
                if (guard != null) { guard.Step = first + i; guard.HaveStepFingerprint = false; }
                long t0 = Stopwatch.GetTimestamp();
                double loss = trainer.Step(first + i, xbuf, ybuf, batch, time);
                long t1 = Stopwatch.GetTimestamp();
                long fp = guard != null && guard.HaveStepFingerprint ? guard.StepFingerprint : P.Fingerprint();
                bool pending = guard != null && guard.Pending != null;
                Marshal.WriteInt64(fpSink, fp);
                Marshal.WriteInt64(fpSink, 8, pending ? 1 : 0);
                Marshal.WriteInt64(blockLoss, 8 * i, BitConverter.DoubleToInt64Bits(loss));
                Marshal.WriteInt64(blockSeconds, 8 * i, BitConverter.DoubleToInt64Bits((t1 - t0) / (double)Stopwatch.Frequency));
                Marshal.WriteInt64(fpSink, 16, i + 1);
                if (pending || fp != reference || t1 - start >= budget) return i + 1;
            }
            return count;
        }

        /// <summary>What the in-step check found inside the last step, before the optimizer call it guards, as one
        /// JSON object {"step", "call", "body"} (body: the snapshot body read at that moment, ProbeCore.Read);
        /// "" when it found nothing. Cleared by the call.</summary>
        public string TakeInStep()
        {
            InStepReport r = guard == null ? null : guard.Take();
            if (r == null) return "";
            var w = new JsonWriter();
            w.BeginObject().Name("step").Long(r.Step).Name("call").String(r.Call).Name("body").Raw(r.Body).EndObject();
            return w.ToString();
        }

        /// <summary>After an exception escaped the trainer's Step: the pre-step check and the disposed-member check
        /// once more on the live objects, one line per finding; the model parameter whose handle is the key in
        /// <paramref name="exceptionMessage"/> ("The given key 'N' was not present in the dictionary", TorchSharp's
        /// KeyNotFoundException); "nothing to name: ..." when everything agrees. Never throws.</summary>
        public string CrashDiagnosis(string exceptionMessage)
        {
            var lines = new System.Collections.Generic.List<string>();
            try {
                string key = KeyIn(exceptionMessage);
                if (key != null) {
                    long h;
                    string name = long.TryParse(key, System.Globalization.NumberStyles.Integer, System.Globalization.CultureInfo.InvariantCulture, out h)
                        ? P.ParameterNameOf(h) : null;
                    lines.Add(name != null
                        ? "the key " + key + " is the handle of model parameter " + name + ", which has no optimizer state"
                        : "the key " + key + " is the handle of no current model parameter");
                }
                foreach (PreStepProblem p in P.PreStepProblems()) lines.Add(p.Code + " " + p.Line);
                if (lines.Count == 0)
                    lines.Add("nothing to name: the model's parameters, the optimizer's members and its state keys agree, and no member is disposed");
            } catch (Exception e) {
                lines.Add("the live model and optimizer could not be checked: " + e.GetType().FullName + ": " + e.Message);
            }
            return string.Join("\n", lines.ToArray());
        }

        static string KeyIn(string message)
        {
            if (message == null) return null;
            const string marker = "The given key '";
            int i = message.IndexOf(marker, StringComparison.Ordinal);
            if (i < 0) return null;
            int start = i + marker.Length, end = message.IndexOf('\'', start);
            return end > start ? message.Substring(start, end - start) : null;
        }

        /// <summary>The probe core (benchmarks, Bench.cs).</summary>
        internal ProbeCore Core { get { return P; } }

        /// <summary>Held-out loss of one batch (no gradients, no step).</summary>
        public double EvalLoss(IntPtr x, IntPtr y, int batch, int time)
        {
            Load(x, y, batch, time);
            return trainer.EvalLoss(xbuf, ybuf, batch, time);
        }

        /// <summary>ProbeCore.Fingerprint: one hash of every identity the pre-step check compares.</summary>
        public long Fingerprint() { return P.Fingerprint(); }

        /// <summary>ProbeCore.PreStepCheck: "" when model, members and state keys agree.</summary>
        public string PreStepCheck() { return P.PreStepCheck(); }

        /// <summary>ProbeCore.Read: the snapshot body as one JSON object (prestep_findings included).</summary>
        public string Probe() { return P.Read(); }

        public string Inject(string name) { return trainer.Inject(name); }

        public string Lifecycle(string kind) { return trainer.Lifecycle(kind); }
    }
}
