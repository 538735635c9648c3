// What the Python worker (optcheck/torchsharp_bridge/worker.py) calls: one call per step,
// one per pre-step check, one per snapshot. Batches arrive as pointers to int64 row-major
// (batch, time) arrays owned by Python (numpy), copied here into reused long[] buffers.
using System;
using System.Diagnostics;
using System.Reflection;
using System.Runtime.InteropServices;

namespace OptCheck.Probe
{
    public sealed class Driver
    {
        readonly ITrainer trainer;
        ProbeCore probe;
        long[] xbuf = new long[0], ybuf = new long[0];

        public Driver(ITrainer trainer)
        {
            if (trainer == null) throw new ArgumentNullException("trainer");
            this.trainer = trainer;
        }

        /// <summary>Construct the ITrainer named <paramref name="typeName"/> (a full type name, looked up in
        /// this assembly, then in every loaded assembly) and wrap it.</summary>
        /// <exception cref="ArgumentException">no such type, or it does not implement ITrainer.</exception>
        public static Driver ForType(string typeName)
        {
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

        public ITrainer Trainer { get { return trainer; } }

        /// <summary>Build model and optimizer (ITrainer.Setup), then the probe over ITrainer.Target.</summary>
        public void Setup(string[] names, string[] values)
        {
            trainer.Setup(names, values);
            probe = new ProbeCore(trainer.Target);
        }

        ProbeCore P
        {
            get {
                if (probe == null) throw new InvalidOperationException("Driver.Setup was not called");
                return probe;
            }
        }

        void Load(IntPtr x, IntPtr y, int batch, int time)
        {
            int n = checked(batch * time);
            if (xbuf.Length != n) { xbuf = new long[n]; ybuf = new long[n]; }
            Marshal.Copy(x, xbuf, 0, n);
            Marshal.Copy(y, ybuf, 0, n);
        }

        /// <summary>One training step on int64 (batch, time) inputs/targets at x, y; returns the loss.
        /// Whatever the trainer throws propagates (KeyNotFoundException from AdamW.step, ...).</summary>
        public double Step(long step, IntPtr x, IntPtr y, int batch, int time)
        {
            Load(x, y, batch, time);
            return trainer.Step(step, xbuf, ybuf, batch, time);
        }

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

        /// <summary>ProbeCore.Read: the snapshot's arrays.</summary>
        public ProbeArrays Probe() { return P.Read(); }

        public string Inject(string name) { return trainer.Inject(name); }

        public string Lifecycle(string kind) { return trainer.Lifecycle(kind); }

        /// <summary>Benchmark: <paramref name="n"/> steps run by a loop inside .NET (steps first..first+n-1,
        /// the same batch each time); returns the wall seconds of the whole loop.</summary>
        public double TimeSteps(long first, IntPtr x, IntPtr y, int batch, int time, int n)
        {
            Load(x, y, batch, time);
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) trainer.Step(first + i, xbuf, ybuf, batch, time);
            return sw.Elapsed.TotalSeconds;
        }

        /// <summary>Benchmark: <paramref name="n"/> pre-step checks (Fingerprint) inside .NET; wall seconds.</summary>
        public double TimeFingerprints(int n)
        {
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) P.Fingerprint();
            return sw.Elapsed.TotalSeconds;
        }

        /// <summary>Benchmark: <paramref name="n"/> probe readings inside .NET; wall seconds.</summary>
        public double TimeProbes(int n)
        {
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) P.Read();
            return sw.Elapsed.TotalSeconds;
        }
    }
}
