// Benchmark-only entry points (benchmarks/bench_torchsharp.py, benchmarks/bench_bridge.py), kept
// out of Driver, which holds only what the worker calls. Each runs its loop inside .NET and returns
// the wall seconds it took (Stopwatch), so no Python call is inside the timed part.
using System;
using System.Diagnostics;
using System.Runtime.InteropServices;
using OptCheck.Contract;

namespace OptCheck.Probe
{
    internal static class Bench
    {
        /// <summary>Plain mode: the trainer's own loop, as a user runs it — no probe, no pre-step check,
        /// no Python per step. Constructs the ITrainer named <paramref name="trainerType"/> (as
        /// Driver.ForType), calls Setup(configJson) (not timed), then steps 1..n on the batches at
        /// <paramref name="batches"/>: int64 (n, 2, batch, time), row-major, inputs then targets of each
        /// step. Returns {wall seconds of the n steps, loss of step 1, loss of step n}.</summary>
        public static double[] PlainLoop(string trainerType, string configJson, IntPtr batches, int n, int batch, int time)
        {
            ITrainer t = Driver.ForType(trainerType).Trainer;
            t.Setup(configJson);
            int bt = checked(batch * time);
            var all = new long[checked(2 * n * bt)];
            Marshal.Copy(batches, all, 0, all.Length);
            var x = new long[bt];
            var y = new long[bt];
            double first = double.NaN, last = double.NaN;
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) {
                Array.Copy(all, (long)2 * i * bt, x, 0, bt);
                Array.Copy(all, (long)(2 * i + 1) * bt, y, 0, bt);
                last = t.Step(i + 1, x, y, batch, time);
                if (i == 0) first = last;
            }
            return new[] { sw.Elapsed.TotalSeconds, first, last };
        }

        /// <summary><paramref name="n"/> steps of the driver's trainer by a loop inside .NET (steps
        /// first..first+n-1, the same batch each time); wall seconds.</summary>
        public static double TimeSteps(Driver d, long first, IntPtr x, IntPtr y, int batch, int time, int n)
        {
            d.Load(x, y, batch, time);
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) d.Trainer.Step(first + i, d.xbuf, d.ybuf, batch, time);
            return sw.Elapsed.TotalSeconds;
        }

        /// <summary><paramref name="n"/> calls of Driver.StepBound (steps first..first+n-1, on the bound buffers) by a loop
        /// inside .NET: what the worker's step costs without the pythonnet call around it; wall seconds.</summary>
        public static double TimeStepBound(Driver d, long first, int batch, int time, int n)
        {
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) d.StepBound(first + i, batch, time);
            return sw.Elapsed.TotalSeconds;
        }

        /// <summary>Steps 1..<paramref name="n"/> of the driver's trainer through Driver.StepBlock by a loop inside
        /// .NET, in blocks of <paramref name="block"/> steps as the worker's cadence cuts them (a block that ends
        /// early goes on from its next step), on the batches at <paramref name="xs"/> and <paramref name="ys"/>:
        /// int64 (n, batch, time) each, bound block by block (no copy). What StepBlock adds to the trainer's
        /// steps — the fingerprint after each step, the in-step flag, the losses and step times — without
        /// the pythonnet call; wall seconds.</summary>
        public static double StepBlocks(Driver d, IntPtr xs, IntPtr ys, int n, int batch, int time, int block, double budgetSeconds)
        {
            int bt = checked(batch * time);
            IntPtr sink = Marshal.AllocHGlobal(24), results = Marshal.AllocHGlobal(16 * block);
            try {
                d.BindBlock(results, results + 8 * block, block);
                long reference = d.Fingerprint();
                var sw = Stopwatch.StartNew();
                for (int first = 1; first <= n; ) {
                    int count = Math.Min(block - (first - 1) % block, n - first + 1);
                    long offset = (long)(first - 1) * bt * 8;
                    d.Bind(new IntPtr(xs.ToInt64() + offset), new IntPtr(ys.ToInt64() + offset), count * bt, sink);
                    first += d.StepBlock(first, count, batch, time, reference, budgetSeconds);
                }
                return sw.Elapsed.TotalSeconds;
            } finally {
                Marshal.FreeHGlobal(sink);
                Marshal.FreeHGlobal(results);
            }
        }

        /// <summary><paramref name="n"/> pre-step fingerprints (ProbeCore.Fingerprint) inside .NET; wall seconds.</summary>
        public static double TimeFingerprints(Driver d, int n)
        {
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) d.Core.Fingerprint();
            return sw.Elapsed.TotalSeconds;
        }

        /// <summary><paramref name="n"/> full pre-step checks (ProbeCore.PreStepCheck) inside .NET; wall seconds.</summary>
        public static double TimePreStepChecks(Driver d, int n)
        {
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) d.Core.PreStepCheck();
            return sw.Elapsed.TotalSeconds;
        }

        /// <summary><paramref name="n"/> probe readings (ProbeCore.Read) inside .NET; wall seconds.</summary>
        public static double TimeProbes(Driver d, int n)
        {
            var sw = Stopwatch.StartNew();
            for (int i = 0; i < n; i++) d.Core.Read();
            return sw.Elapsed.TotalSeconds;
        }
    }
}
