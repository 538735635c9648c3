// The pre-step check for C# code that does not run under optcheck: call Check() before
// optimizer.step(), and a model/optimizer mismatch throws PreStepCheckException naming the
// parameters instead of TorchSharp's KeyNotFoundException with a bare handle. It is the worker's
// own check (ProbeCore.PreStepCheck) run the way the worker runs it: a fingerprint every step,
// the full comparison only when the fingerprint changed since the last clean check.
using System;

namespace OptCheck.Probe
{
    /// <summary>What PreStepGuard.Check throws: the problems ProbeCore.PreStepCheck found, one per line
    /// (e.g. "1 optimizer member(s) have no state, the next step() throws KeyNotFoundException for key
    /// 1124667216: h.0.mlp.c_fc.weight (handle 1124667216)").</summary>
    public sealed class PreStepCheckException : InvalidOperationException
    {
        /// <summary>The problems, one per entry.</summary>
        public readonly string[] Problems;

        public PreStepCheckException(string problems)
            : base("optcheck pre-step check: the optimizer no longer matches the model; step() would fail or train the wrong tensors:\n" + problems)
        {
            Problems = problems.Split('\n');
        }
    }

    /// <summary>Checks a model and its optimizer (an IProbeTarget) before each optimizer step.
    /// One instance per training loop; not thread-safe.</summary>
    public sealed class PreStepGuard
    {
        readonly ProbeCore core;
        long cleanFingerprint;
        bool haveClean;

        /// <exception cref="ArgumentNullException">target is null.</exception>
        public PreStepGuard(IProbeTarget target)
        {
            core = new ProbeCore(target);
        }

        /// <summary>Full checks run so far (the others were a fingerprint only).</summary>
        public int FullChecks { get; private set; }

        /// <summary>Throw PreStepCheckException when the optimizer's members, its state keys and the model's
        /// parameters disagree (by handle and by data pointer); return silently when they agree. Cost: one
        /// ProbeCore.Fingerprint while nothing changed since the last clean check, else ProbeCore.PreStepCheck.</summary>
        /// <exception cref="PreStepCheckException">the problems found, naming each parameter and handle.</exception>
        public void Check()
        {
            long fp = core.Fingerprint();
            if (haveClean && fp == cleanFingerprint) return;
            FullChecks++;
            string problems = core.PreStepCheck();
            if (problems.Length > 0) {
                haveClean = false;
                throw new PreStepCheckException(problems);
            }
            cleanFingerprint = fp;
            haveClean = true;
        }
    }
}
