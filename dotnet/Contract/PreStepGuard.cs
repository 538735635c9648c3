// The pre-step check at the optimizer's own calls. A user's bug (model.to(float64), a replaced or
// late-registered Parameter, a disposed tensor) sits inside their step, before their own
// optimizer.zero_grad() / step(), so a check that runs only between steps cannot see it before
// TorchSharp throws. PreStepGuard.Before(call) is run by a wrapped optimizer at each of those calls
// (TorchSharp: GuardedOptimizer, Contract/TorchSharp/ModuleTrainer.cs; the stand-in: tests/dotnet/TestLoop.cs), and by
// Check() in loops that call it by hand. It is the worker's own check (ProbeCore.PreStepProblems)
// run the way the worker runs it: a fingerprint per call, the full comparison only when the
// fingerprint changed since the last clean check.
//
// Two modes: a loop without optcheck throws PreStepCheckException (the problems, structured);
// under optcheck's worker (Driver) the guard records what it found, with the snapshot body read at
// that moment, and lets the call go on: optcheck never breaks the run it watches, and TorchSharp's
// own exception, when one follows, is reported after the findings.
using System;
using System.Collections.Generic;
using OptCheck.Probe;

namespace OptCheck.Contract
{
    /// <summary>One problem the pre-step check found: the finding code it is (OC101 stale member, OC102
    /// untracked parameter, OC103 orphan state key, OC108 member without state, OC109 disposed member), the
    /// line PreStepGuard shows, the names and handles involved and, for OC108, the exception the next step()
    /// throws and its key.</summary>
    public sealed class PreStepProblem
    {
        public string Code, Line, PredictedException, PredictedKey;
        /// <summary>The parameters' names (a disposed member: its name at the last clean check, else "group G member I").</summary>
        public readonly List<string> Names = new List<string>();
        /// <summary>Their handles (Tensor.Handle; 0 for a disposed member).</summary>
        public readonly List<long> Refs = new List<long>();
        /// <summary>The handles (the same list as Refs).</summary>
        public List<long> Handles { get { return Refs; } }
    }

    /// <summary>What PreStepGuard throws in a loop run without optcheck: the problems ProbeCore.PreStepProblems
    /// found (code, names, handles, predicted exception and key), and the optimizer call it stopped.</summary>
    public sealed class PreStepCheckException : InvalidOperationException
    {
        /// <summary>The problems, structured (PreStepProblem: Code, Names, Handles, PredictedException, PredictedKey, Line).</summary>
        public readonly IList<PreStepProblem> Problems;
        /// <summary>The optimizer call that was about to run ("step()", "zero_grad()"), or null for PreStepGuard.Check().</summary>
        public readonly string Call;

        public PreStepCheckException(IList<PreStepProblem> problems, string call)
            : base(Text(problems, call))
        {
            Problems = problems ?? new List<PreStepProblem>();
            Call = call;
        }

        /// <summary>One line per problem (PreStepProblem.Line).</summary>
        public string[] Lines
        {
            get {
                var r = new string[Problems.Count];
                for (int i = 0; i < r.Length; i++) r[i] = Problems[i].Line;
                return r;
            }
        }

        static string Text(IList<PreStepProblem> problems, string call)
        {
            var lines = new List<string>();
            if (problems != null) foreach (PreStepProblem p in problems) lines.Add(p.Line);
            return "optcheck pre-step check" + (call == null ? "" : " at optimizer." + call) +
                   ": the optimizer no longer matches the model; " + (call ?? "step()") + " would fail or train the wrong tensors:\n" +
                   string.Join("\n", lines.ToArray());
        }
    }

    /// <summary>What the guard found inside a step while recording (under optcheck's worker).</summary>
    internal sealed class InStepReport
    {
        /// <summary>The step (Driver.StepBound's) and the optimizer call about to run ("step()", "zero_grad()").</summary>
        public long Step;
        public string Call;
        /// <summary>The problems, and the snapshot body (ProbeCore.Read) read at that moment, before the call.</summary>
        public List<PreStepProblem> Problems;
        public string Body;
    }

    /// <summary>Checks a model and its optimizer (an IProbeTarget) before each optimizer call.
    /// One instance per training loop; not thread-safe.</summary>
    public sealed class PreStepGuard
    {
        readonly ProbeCore core;
        long cleanFingerprint, reportedFingerprint;
        bool haveClean, haveReported;

        /// <exception cref="ArgumentNullException">target is null.</exception>
        internal PreStepGuard(IProbeTarget target)
        {
            core = new ProbeCore(target);
        }

        /// <summary>Full checks run so far (the others were a fingerprint only).</summary>
        public int FullChecks { get; private set; }

        /// <summary>Under optcheck's worker (set by Driver): record, never throw.</summary>
        internal bool Recording;
        /// <summary>The step being run (set by Driver before each step).</summary>
        internal long Step;
        /// <summary>The first report of the current step (Driver takes it).</summary>
        internal InStepReport Pending;
        /// <summary>Why the last check could not run (recording mode swallows it), or null.</summary>
        internal string LastError;
        /// <summary>The fingerprint the check computed at the step's optimizer.step() call (recording; the Driver
        /// clears it before each step and, when set, hands it on as the next pre-step fingerprint instead of
        /// computing another: the in-step check is the fingerprint the worker computes anyway).</summary>
        internal long StepFingerprint;
        internal bool HaveStepFingerprint;

        /// <summary>Throw PreStepCheckException when the optimizer's members, its state keys and the model's
        /// parameters disagree (by handle and by data pointer), or a member is disposed; return silently when
        /// they agree. Cost: one ProbeCore.Fingerprint while nothing changed since the last clean check.</summary>
        /// <exception cref="PreStepCheckException">the problems found, naming each parameter and handle.</exception>
        public void Check()
        {
            Before(null);
        }

        /// <summary>The check before optimizer call <paramref name="call"/> ("step()", "zero_grad()"), run by a
        /// wrapped optimizer. Without optcheck: throws PreStepCheckException. Under optcheck's worker: records the
        /// problems and the snapshot body once per changed state, and returns; nothing it reads raises.</summary>
        /// <exception cref="PreStepCheckException">(not recording) the problems found.</exception>
        public void Before(string call)
        {
            if (!Recording) { CheckOrThrow(call); return; }
            try {
                CheckOrRecord(call);
            } catch (Exception e) {
                LastError = e.GetType().FullName + ": " + e.Message;
            }
        }

        void CheckOrThrow(string call)
        {
            long fp = core.Fingerprint();
            if (haveClean && fp == cleanFingerprint) return;
            FullChecks++;
            List<PreStepProblem> problems = core.PreStepProblems();
            if (problems.Count > 0) {
                haveClean = false;
                throw new PreStepCheckException(problems, call);
            }
            cleanFingerprint = fp;
            haveClean = true;
        }

        void CheckOrRecord(string call)
        {
            long fp = core.Fingerprint();
            if (call == "step()") { StepFingerprint = fp; HaveStepFingerprint = true; }
            if (haveClean && fp == cleanFingerprint) return;
            if (haveReported && fp == reportedFingerprint) return;   // this state was reported already
            FullChecks++;
            List<PreStepProblem> problems = core.PreStepProblems();
            if (problems.Count == 0) {
                cleanFingerprint = fp;
                haveClean = true;
                return;
            }
            haveClean = false;
            reportedFingerprint = fp;
            haveReported = true;
            if (Pending != null) return;
            Pending = new InStepReport {
                Step = Step, Call = call ?? "step()", Problems = problems,
                Body = core.Read("in-step check: found inside the trainer's Step at step " + Step + ", before its optimizer." +
                                 (call ?? "step()") + " ran (" + problems.Count + " problem(s); what that call throws is predicted below)"),
            };
        }

        /// <summary>The pending report, cleared; null when none.</summary>
        internal InStepReport Take()
        {
            InStepReport r = Pending;
            Pending = null;
            return r;
        }
    }

    /// <summary>Implemented by a trainer whose optimizer calls run PreStepGuard.Before (ModuleTrainer):
    /// the Driver switches the guard to recording and reports what it found inside each step.</summary>
    internal interface IGuardedTrainer
    {
        /// <summary>The guard the trainer's optimizer runs; null = none.</summary>
        PreStepGuard Guard { get; }
    }
}
